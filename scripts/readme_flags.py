#!/usr/bin/env python3
"""README.md's flag table is `snapserve --help=markdown`'s output, held
between two marker lines. `readme_flags.py --write` puts the binary's table
there; without it, the script exits 1 and prints a diff when they differ
(tests/python/test_readme_flags.py runs that check in `make test`).

    scripts/readme_flags.py [--write] [--binary build/server/snapserve]
"""
import argparse
import difflib
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN = "<!-- flags:begin"
END = "<!-- flags:end -->"


def generated(binary):
    out = subprocess.run([str(binary), "--help=markdown"], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip("\n")


def split(readme):
    """(text before and including the begin marker, the table, text from the end marker)."""
    lines = readme.split("\n")
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN)]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise SystemExit(f"README.md needs one '{BEGIN} ...' line before one '{END}' line")
    b, e = begins[0], ends[0]
    return "\n".join(lines[:b + 1]), "\n".join(lines[b + 1:e]).strip("\n"), "\n".join(lines[e:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="update README.md")
    parser.add_argument("--binary", default=ROOT / "build" / "server" / "snapserve")
    args = parser.parse_args()
    readme_path = ROOT / "README.md"
    head, table, tail = split(readme_path.read_text())
    want = generated(args.binary)
    if args.write:
        readme_path.write_text(f"{head}\n{want}\n{tail}")
        return 0
    if table == want:
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        (table + "\n").splitlines(keepends=True), (want + "\n").splitlines(keepends=True),
        "README.md (flags table)", "snapserve --help=markdown"))
    print("README.md's flag table differs from the binary's: run scripts/readme_flags.py --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
