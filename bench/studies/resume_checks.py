"""``python -m bench.studies.resume_checks``: what resume's checks cost on a folder of done slides.

``N`` (default 1,000) one-tile slides (copies of one generated 448x448 SVS at
0.25 um/px under ``N`` ids) are embedded once through the real CLI and a real
server (``--tissue none --no-qc``), so every done file is the real writer's.
Then, each ``repeats`` times, end to end as a user runs it:

- **resume**: the same command again: every slide is found done and skipped
  (its settings, the settings record, the slide's identity, the done file's
  attributes); wall time of the CLI process, and the mean of the skipped
  slides' ``seconds`` in ``status.csv`` (one slide's checks and status line);
- **one slide**: the same command over one of the slides: start-up alone
  (interpreter, server description, the record), subtracted from the above
  for the cost per done slide;
- **adopt**: the record deleted first, so the run reads every done file's
  recorded settings before any slide (a folder from an older histoserve).

Prints a Markdown table and writes ``resume_checks.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import slides
from harness.embed import embed_command
from harness.packages import copy_package_dir, demo_package
from harness.server import start_server
from histoserve.results.run_record import RUN_FILE

REPO = Path(__file__).resolve().parents[2]
FLAGS = ("--tissue", "none", "--no-qc", "--batch-size", "8", "--progress", "none")


def _manifest(path: Path, rows: list[tuple[str, Path]]) -> Path:
    path.write_text("slide_id,path\n" + "".join(f"{i},{p}\n" for i, p in rows), encoding="utf-8")
    return path


def _run(url: str, manifest: Path, out: Path) -> tuple[float, list[dict[str, str]]]:
    """Wall seconds of one CLI run and its own ``status.csv`` rows (exit 0 asserted)."""
    status = out / "status.csv"
    before = len(_rows(status))
    start = time.perf_counter()
    done = subprocess.run(
        embed_command("--manifest", manifest, "--url", url, "--out", out, *FLAGS),
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"histoserve embed exit {done.returncode}: {done.stderr[-2000:]}")
    return wall, _rows(status)[before:]


def _rows(status: Path) -> list[dict[str, str]]:
    if not status.is_file():
        return []
    with open(status, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def measure(n: int, repeats: int, work: Path) -> dict[str, Any]:
    """Makes ``n`` done slides in ``work`` and times resumed runs over them."""
    first = slides.aperio_svs(work / "slides" / "s0.svs", width=448, height=448, boxes=((0, 0, 448, 448),))  # fmt: skip
    paths = [first.path] + [
        slides.copy_slide(first, work / "slides" / f"s{i}.svs").path for i in range(1, n)
    ]
    rows = [(f"s{i}", p) for i, p in enumerate(paths)]
    everything = _manifest(work / "all.csv", rows)
    one = _manifest(work / "one.csv", rows[:1])
    package = copy_package_dir(demo_package("h0-mini"), work / "package")
    server = start_server(package, work / "server", "--max_batch_size", "8")
    out = work / "out"
    try:
        embed_s, made = _run(server.base, everything, out)
        assert sum(r["status"] == "done" for r in made) == n, "not every slide was embedded"
        resume, per_slide, single, adopt = [], [], [], []
        for _ in range(repeats):
            wall, skipped = _run(server.base, everything, out)
            assert [r["status"] for r in skipped] == ["skipped"] * n, "a slide was embedded again"
            resume.append(wall)
            per_slide.append(statistics.fmean(float(r["seconds"]) for r in skipped))
            single.append(_run(server.base, one, out)[0])
            (out / RUN_FILE).unlink()
            adopt.append(_run(server.base, everything, out)[0])
    finally:
        server.stop()
    resume_s, single_s = statistics.median(resume), statistics.median(single)
    return {
        "slides": n,
        "repeats": repeats,
        "embed_first_s": embed_s,
        "resume_s": resume_s,
        "one_slide_s": single_s,
        "per_done_slide_ms": (resume_s - single_s) / (n - 1) * 1000,
        "status_seconds_per_slide_ms": statistics.median(per_slide) * 1000,
        "adopt_s": statistics.median(adopt),
        "adopt_per_file_ms": (statistics.median(adopt) - resume_s) / n * 1000,
    }


def markdown(r: dict[str, Any]) -> str:
    """The figures as the table docs/cohorts.md quotes."""
    return "\n".join(
        [
            f"| {r['slides']:,} done slides (median of {r['repeats']}) | seconds |",
            "| --- | ---: |",
            f"| first run, every slide embedded | {r['embed_first_s']:.1f} |",
            f"| resumed run, every slide skipped, end to end | {r['resume_s']:.2f} |",
            f"| the same command over one slide (start-up) | {r['one_slide_s']:.2f} |",
            f"| per done slide, end to end | {r['per_done_slide_ms'] / 1000:.4f} |",
            f"| per skipped slide in `status.csv` | {r['status_seconds_per_slide_ms'] / 1000:.4f} |",
            f"| resumed run adopting a folder without record | {r['adopt_s']:.2f} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the measurement; prints the table, writes ``resume_checks.json``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.resume_checks", description=__doc__
    )
    parser.add_argument("--slides", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="resume-checks-"))
    try:
        result = measure(args.slides, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resume_checks.json").write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
