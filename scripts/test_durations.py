#!/usr/bin/env python3
"""Where the suite's minutes go: seconds per test file from pytest's JUnit XML.

Standard library only. Each ``<testcase>`` carries its setup, call and
teardown time; they are summed per file (from the ``classname``, which pytest
writes as the dotted module path, with a class name appended for tests in a
class). Module-scoped fixtures are paid by the first test that takes them, so
a file's sum includes the servers and exports it starts; a session fixture
(an export shared by many files) is paid by whichever file comes first.

Usage: ``python3 scripts/test_durations.py RUN.xml [--top 40] [--before OLD.xml]``
prints a Markdown table, biggest first; with ``--before`` a column per run.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def per_file(xml_path: Path) -> tuple[Counter[str], Counter[str]]:
    """``(seconds, tests)`` per test file path (``tests/x/test_y.py``) of one JUnit XML run."""
    seconds: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        name = "/".join(parts[: module + 1]) + ".py"
        seconds[name] += float(case.get("time", 0.0))
        tests[name] += 1
    return seconds, tests


def table(after: Path, before: Path | None, top: int) -> str:
    """The Markdown table of the ``top`` costliest files of ``after`` (and their ``before``)."""
    seconds, tests = per_file(after)
    old = per_file(before) if before else (Counter(), Counter())
    names = sorted(set(seconds) | set(old[0]), key=lambda n: -max(seconds[n], old[0][n]))[:top]
    head = "| file | tests | s |" if before is None else "| file | tests | s before | s after |"
    rule = "| --- | ---: | ---: |" if before is None else "| --- | ---: | ---: | ---: |"
    rows = [head, rule]
    for n in names:
        if before is None:
            rows.append(f"| `{n}` | {tests[n]} | {seconds[n]:.1f} |")
        else:
            count = tests[n] or old[1][n]
            rows.append(f"| `{n}` | {count} | {old[0][n]:.1f} | {seconds[n]:.1f} |")
    total = f"| all {len(seconds)} files | {sum(tests.values())} |"
    if before is None:
        rows.append(f"{total} {sum(seconds.values()):.1f} |")
    else:
        rows.append(f"{total} {sum(old[0].values()):.1f} | {sum(seconds.values()):.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 2 on a missing or unreadable XML file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", type=Path, help="pytest --junitxml output of the run")
    parser.add_argument("--before", type=Path, help="an earlier run's XML, for a second column")
    parser.add_argument("--top", type=int, default=40, help="files to list (default 40)")
    args = parser.parse_args(argv)
    try:
        print(table(args.xml, args.before, args.top))
    except (OSError, ET.ParseError) as exc:
        print(f"test_durations: cannot read {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
