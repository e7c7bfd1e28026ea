"""scripts/test_durations.py: seconds per test file from pytest's JUnit XML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test_durations.py"
RUN = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.unit.test_a" name="t1" time="1.5"/>
<testcase classname="tests.unit.test_a.TestGroup" name="t2" time="2.0"/>
<testcase classname="tests.integration.test_b" name="t3" time="10.25"/>
</testsuite></testsuites>"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_seconds_are_summed_per_file_biggest_first(tmp_path: Path) -> None:
    (tmp_path / "run.xml").write_text(RUN)
    (tmp_path / "old.xml").write_text(RUN.replace('time="10.25"', 'time="30.0"'))
    done = _run(str(tmp_path / "run.xml"), "--before", str(tmp_path / "old.xml"))
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[2] == "| `tests/integration/test_b.py` | 1 | 30.0 | 10.2 |"
    assert rows[3] == "| `tests/unit/test_a.py` | 2 | 3.5 | 3.5 |"
    assert rows[-1] == "| all 2 files | 3 | 33.5 | 13.8 |"


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _run(str(tmp_path / "none.xml"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "none.xml" in done.stderr
