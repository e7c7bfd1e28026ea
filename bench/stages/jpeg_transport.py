"""Client and server CPU per model tile by reader, resize and transport: issue 35's figures.

A ``make bench`` stage (:func:`stage`, about a minute on one core), also
``python -m bench.stages.jpeg_transport --out DIR``. The generated slides of
:mod:`bench.studies.native_reader` (A: 448 px read at level 0 and resized to 224;
B: a matching level), read in batches of 64 model tiles in plan order along
each path of :data:`PATHS`: OpenSlide + bicubic with raw pixels (the path
before issue 35: "today"), the native reader with each ``--resize`` and raw
pixels, and the native reader with ``--transport jpeg``. Per path:

- **client CPU ms per tile**: this thread's CPU time to read a batch and
  encode its V2 request body (``pixels``: decode, compose, resize, pack the
  raw tiles; ``jpeg``: gather each slide tile's bytes once, splice the
  tables, pack), over the whole slide, and the tiles/s one core gives;
- **bytes per tile**: the request bodies' length over the tiles;
- **server CPU ms per tile** (``jpeg``): the stage-1 work the server does
  instead (:class:`predictor.codecs.jpeg_input.JpegTiles`: libjpeg-turbo
  decode, compose, resize); the pixel path's stage 1 is a view;
- each as a ratio to today's path on the same slide, and issue 35's goal
  (client ms per tile: native at most 1.5 on A and 1.0 on B, jpeg at most
  0.5; jpeg bytes at most a third of raw at a matching level).

The paths alternate round by round (interleaved, best of ``repeats``), so
drift on the shared machine hits all alike. Pixel fidelity of each resize
is :mod:`bench.studies.native_reader`'s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.markdown import table
from bench.studies.native_reader import EDGE, write_slides

BATCH = 64
# (reader, resize, transport); "today" is the first.
PATHS = (
    ("openslide", "bicubic", "pixels"),
    ("native", "bicubic", "pixels"),
    ("native", "area", "pixels"),
    ("native", "reduced", "pixels"),
    ("native", "bicubic", "jpeg"),
)
# Issue 35's goals: client CPU ms per tile per (slide, transport) of the native reader.
GOAL_MS = {("A", "pixels"): 1.5, ("B", "pixels"): 1.0, ("A", "jpeg"): 0.5, ("B", "jpeg"): 0.5}
GOAL_BYTES_VS_RAW = 1 / 3  # jpeg at a matching level (B)


def client_pass(
    path: Path, reader: str, resize: str, transport: str
) -> tuple[float, int, int, list[Any]]:
    """CPU seconds, body bytes and tiles for one pass over the slide; the jpeg batches."""
    from histoserve import wire
    from histoserve.slides.grid import plan_tiles, read_tiles
    from histoserve.slides.readers import SlideReader, resolve_mpp
    from histoserve.slides.tiff.wire_tiles import jpeg_batch

    with SlideReader.open(path, reader) as slide:
        plan = plan_tiles(
            slide, resolve_mpp(slide, None, None, 0.05), 0.5, 224, 0.05, resize=resize
        )
        coords, sent, batches = plan.coords, 0, []
        start = time.thread_time()
        for i in range(0, len(coords), BATCH):
            if transport == "jpeg":
                batch = jpeg_batch(
                    slide.native, plan.read_level, plan.read_size, coords[i : i + BATCH]
                )
                body, _ = wire.encode_request(batch.inputs())
                batches.append(batch)
            else:
                body, _ = wire.encode_request(
                    {"pixels": read_tiles(slide, plan, coords[i : i + BATCH])}
                )
            sent += len(body)
        return time.thread_time() - start, sent, len(coords), batches


def server_pass(batches: list[Any]) -> float:
    """CPU seconds of the server's stage 1 over every jpeg batch (one thread)."""
    from predictor.codecs.jpeg_input import jpeg_regions
    from predictor.config import LimitsConfig

    start = time.thread_time()
    for batch in batches:
        regions = jpeg_regions(
            batch.streams, batch.layout, batch.boxes, limits=LimitsConfig(), tile_size=224,
            interpolation="bicubic",
        )  # fmt: skip
        for region in regions:
            region.pixels()
    return time.thread_time() - start


def paths_for(slide: str) -> list[tuple[str, str, str]]:
    """The paths measured on ``slide``: B's matching level is never resized (one resize only)."""
    return [p for p in PATHS if slide == "A" or p[1] == "bicubic"]


def measure(paths: dict[str, Path], repeats: int) -> list[dict[str, Any]]:
    """One row per slide and path, with its ratios to today's path and its goal."""
    rows = []
    for name, path in paths.items():
        best: dict[tuple[str, str, str], dict[str, float]] = {}
        for _ in range(repeats):
            for case in paths_for(name):
                seconds, sent, n, batches = client_pass(path, *case)
                server = server_pass(batches) if batches else 0.0
                row = best.setdefault(case, {"client": float("inf"), "server": float("inf")})
                row["client"] = min(row["client"], seconds)
                row["server"] = min(row["server"], server)
                row["bytes"], row["tiles"] = sent, n
        today = best[PATHS[0]]
        for (reader, resize, transport), r in best.items():
            ms = 1000 * r["client"] / r["tiles"]
            goal = GOAL_MS.get((name, transport)) if reader == "native" else None
            rows.append(
                {
                    "slide": name,
                    "reader": reader,
                    "resize": resize if name == "A" else "none",
                    "transport": transport,
                    "tiles": r["tiles"],
                    "client_cpu_ms_per_tile": ms,
                    "tiles_per_s_per_core": 1000 / ms if ms > 0 else None,
                    "client_cpu_vs_today": r["client"] / today["client"],
                    "bytes_per_tile": r["bytes"] / r["tiles"],
                    "bytes_vs_raw": r["bytes"] / today["bytes"],
                    "server_cpu_ms_per_tile": 1000 * r["server"] / r["tiles"],
                    "goal_client_ms": goal,
                    "met": None if goal is None else ms <= goal,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as one Markdown table (the one ``docs/cohorts.md`` quotes)."""
    header = (
        "slide",
        "reader + resize, transport",
        "client CPU ms / tile",
        "tiles/s per client core",
        "vs today",
        "kB / tile on the wire",
        "vs raw",
        "server CPU ms / tile",
        "goal ms",
        "met",
    )
    cells = [
        (
            r["slide"],
            f"{r['reader']} + {r['resize']}, {r['transport']}",
            r["client_cpu_ms_per_tile"],
            f"{r['tiles_per_s_per_core']:,.0f}",
            r["client_cpu_vs_today"],
            f"{r['bytes_per_tile'] / 1000:.1f}",
            r["bytes_vs_raw"],
            r["server_cpu_ms_per_tile"],
            r["goal_client_ms"],
            {None: "–", True: "yes", False: "no"}[r["met"]],
        )
        for r in rows
    ]
    return "\n".join(table(header, cells))


def stage(repeats: int = 3, edge: int = EDGE) -> dict[str, Any]:
    """The ``make bench`` stage: slides written to a temporary folder, every path measured."""
    with tempfile.TemporaryDirectory(prefix="bench-slide-reading-") as folder:
        rows = measure(write_slides(Path(folder), edge), repeats)
    return {"edge_px": edge, "batch": BATCH, "repeats": repeats, "rows": rows}


def section(results: dict[str, Any] | None) -> list[str]:
    """``results.md``'s section for :func:`stage`'s results (none when it did not run)."""
    if not results:
        return []
    return [
        "## Slide reading and transport (issue 35)",
        "",
        f"Generated {results['edge_px']} px Aperio-style slides (A: 448 px read at level 0 "
        "and resized to 224; B: a matching level), batches of "
        f"{results['batch']}, best of {results['repeats']}, one thread; 'today' is "
        "OpenSlide + bicubic with raw pixels. `python -m bench.stages.jpeg_transport`.",
        "",
        *markdown(results["rows"]).splitlines(),
        "",
    ]


def write(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """``slide_reading.json`` and ``slide_reading.md`` under ``out``; returns ``results``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "slide_reading.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "slide_reading.md").write_text("\n".join(section(results)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stages.jpeg_transport", description=__doc__
    )
    parser.add_argument("--out", type=Path, help="write slide_reading.{json,md} into this folder")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results = stage(args.repeats)
    if args.out is not None:
        write(results, args.out)
    print(markdown(results["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
