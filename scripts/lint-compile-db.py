#!/usr/bin/env python3
"""Writes a copy of the build's compile_commands.json for clang-tidy.

The GCC build precompiles LibTorch's headers (cmake/PrecompiledTorch.cmake)
and each command force-includes that header; GCC's precompiled header means
nothing to clang, so the copy drops it and clang reads the headers themselves.

usage: lint-compile-db.py BUILD_DIR OUT_DIR
"""
import json
import pathlib
import re
import shlex
import sys

PCH_INCLUDE = re.compile(r"cmake_pch\.hxx$")


def without_pch(command: str) -> str:
    args = shlex.split(command)
    kept = []
    skip_next = False
    for i, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        if arg == "-include" and i + 1 < len(args) and PCH_INCLUDE.search(args[i + 1]):
            skip_next = True
            continue
        if arg == "-Winvalid-pch":
            continue
        kept.append(arg)
    return shlex.join(kept)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    build, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    entries = [
        e for e in json.loads((build / "compile_commands.json").read_text())
        if not e["file"].endswith("cmake_pch.hxx.cxx")  # the header's own build
    ]
    for entry in entries:
        if "command" in entry:
            entry["command"] = without_pch(entry["command"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_commands.json").write_text(json.dumps(entries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
