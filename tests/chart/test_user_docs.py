"""The user docs stay user docs: a short README whose links resolve, no project history.

Evidence (run times, per-run tables, which change moved which figure) lives in
``docs/performance.md``, ``bench/README.md`` and ``docs/reliability.md``; the
README keeps a summary and links there.
"""

from __future__ import annotations

import re

import pytest

from tests.chart.helpers import REPO

README = REPO / "README.md"
USER_DOCS = ("README.md", "docs/deployment.md", "docs/cohorts.md")
HISTORY = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "a commit hash": re.compile(r"(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a run's time of day": re.compile(r"\b\d{1,2}:\d\d(?:-\d{1,2}:\d\d)?\s*UTC\b"),
}


def _text(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", USER_DOCS)
def test_user_docs_carry_no_project_history(name):
    text = _text(name)
    found = {what: rx.findall(text) for what, rx in HISTORY.items() if rx.findall(text)}
    assert not found, f"{name}: {found}"


def test_the_history_patterns_match_history():
    """The check can fail: each pattern catches what it is for and spares ordinary text."""
    assert HISTORY["an issue number"].search("as issue 12 showed")
    assert not HISTORY["an issue number"].search("--min-tissue 0.25")
    assert HISTORY["a commit hash"].search("the server at 33e2509 before")
    assert not HISTORY["a commit hash"].search("1536 floats, 4096x4096, deadbeef")
    assert HISTORY["a date"].search("run on 2026-12-01")
    assert HISTORY["a run's time of day"].search("(make bench, 19:06-19:31 UTC)")


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)\)", _text("README.md"))
    local = [link for link in links if "://" not in link]
    assert len(local) >= 5
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, missing


def test_the_performance_summary_is_five_rows_and_links_the_evidence():
    text = _text("README.md")
    section = text[text.index("## Performance") :].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 5, rows  # header, rule, five measures
    assert "(docs/performance.md)" in section and "(bench/README.md)" in section


def test_the_readme_python_examples_compile():
    """Every Python block parses, and the first (the client) defines what it uses."""
    blocks = re.findall(r"```python\n(.*?)```", _text("README.md"), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        compile(block, "README.md", "exec")
    first = blocks[0]
    for name in re.findall(r"\b(tiles|png_bytes)\b", first):
        assert re.search(rf"^{name} = ", first, flags=re.MULTILINE), name


RATE = re.compile(
    r"\d[\d,.]*(?:-[\d,.]+)?\s*(?:tiles/s|TFLOP/s|tiles per CPU-second|decodes/s|GB/s)"
)


def test_every_rate_in_the_docs_names_its_source_or_says_estimate():
    """Docs say only what was measured: a section (README.md, docs/*.md) stating a rate
    names the ``bench/results/`` file it comes from, or says "estimate" (and shows how)."""
    unsourced = []
    for path in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for section in re.split(r"(?m)^(?=#{1,4} )", path.read_text(encoding="utf-8")):
            rates = RATE.findall(section)
            sourced = "bench/results/" in section or re.search(r"\bestimate", section, re.I)
            if rates and not sourced:
                unsourced.append((path.name, section.splitlines()[0][:60], rates[:3]))
    assert not unsourced, unsourced
