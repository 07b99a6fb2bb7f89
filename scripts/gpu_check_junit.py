"""Counts one JUnit XML file (pytest's --junitxml or ctest's --output-junit)
for scripts/gpu-check.sh.

Prints one line, `passed=P failed=F errors=E skipped=S total=T`, then one
line per test that did not pass (`FAILED name`, `ERROR name`, `SKIPPED name:
reason`). Exits 0 when the file parses, 2 when it is missing or unreadable
(a process that crashed writes none). Whether a count is acceptable is the
caller's decision.

Usage: gpu_check_junit.py FILE.xml
"""
import sys
import xml.etree.ElementTree as ET


def case_name(case):
    cls = case.get("classname") or ""
    return f"{cls}::{case.get('name')}" if cls else case.get("name")


def summarize(path):
    root = ET.parse(path).getroot()
    counts = dict(passed=0, failed=0, errors=0, skipped=0)
    lines = []
    for case in root.iter("testcase"):
        name = case_name(case)
        if case.find("failure") is not None or case.get("status") == "fail":
            counts["failed"] += 1
            lines.append(f"FAILED {name}")
        elif case.find("error") is not None:
            counts["errors"] += 1
            lines.append(f"ERROR {name}")
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            counts["skipped"] += 1
            skipped = case.find("skipped")
            reason = skipped.get("message", "") if skipped is not None else case.get("status")
            lines.append(f"SKIPPED {name}: {reason}")
        else:
            counts["passed"] += 1
    counts["total"] = sum(counts.values())
    return counts, lines


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        counts, lines = summarize(argv[1])
    except (OSError, ET.ParseError) as error:
        print(f"unreadable junit {argv[1]}: {error}")
        return 2
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
