#!/usr/bin/env python3
"""Lists the tests a ctest run skipped, from its JUnit XML (`ctest --output-junit`).

A unit test may skip only for a CPU feature that the instruction-set level in
effect lacks, and then says "needs CPU feature <name>"
(tests/unit/common/hardware_skip.h). Those skips are listed by name, one a
line; any other skipped or disabled test is listed too, and the exit status is
then 1, so that `make test-unit` fails on it.

Usage: ctest-skips.py JUNIT_XML
"""

import re
import sys
import xml.etree.ElementTree as ET

CPU_FEATURE = re.compile(r"needs CPU feature (\S+)")


def skip_reason(case):
    """The test's own words for why it skipped: the line after GoogleTest's
    "file:line: Skipped", else the last line of its output, else ctest's."""
    lines = [line.strip() for line in (case.findtext("system-out") or "").splitlines()]
    lines = [line for line in lines if line]
    for i, line in enumerate(lines[:-1]):
        if line.endswith(": Skipped"):
            return lines[i + 1]
    if lines:
        return lines[-1]
    skipped = case.find("skipped")
    return skipped.get("message", "") if skipped is not None else ""


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        root = ET.parse(argv[1]).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"ctest-skips: cannot read {argv[1]}: {error}", file=sys.stderr)
        return 1
    cases = root.iter("testcase")
    hardware, other = [], []
    total = 0
    for case in cases:
        total += 1
        status = case.get("status", "")
        if status not in ("notrun", "disabled") and case.find("skipped") is None:
            continue
        name = case.get("name", "?")
        output = case.findtext("system-out") or ""
        feature = CPU_FEATURE.search(output)
        if status == "notrun" and feature:
            hardware.append((feature.group(1), name))
        else:
            other.append((name, status, skip_reason(case)))

    for feature, name in sorted(hardware):
        print(f"skipped, needs CPU feature {feature}: {name}")
    for name, status, reason in sorted(other):
        print(f"SKIPPED, NOT FOR A MISSING CPU FEATURE ({status}): {name}: {reason}")
    print(
        f"ctest skips: {len(hardware)} of {total} tests for a missing CPU feature"
        f" (listed above), {len(other)} for any other reason"
    )
    if total == 0:
        print("ctest-skips: the JUnit file lists no test", file=sys.stderr)
        return 1
    if other:
        print(
            "ctest-skips: a test may skip only for a missing CPU feature"
            " (tests/unit/common/hardware_skip.h); make the others run or fail",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
