"""``python -m bench.jpeg_transport``: ``--transport pixels`` vs ``jpeg``, client and server CPU.

Not part of ``make bench`` (under a minute, one core). The generated slides
of :mod:`bench.native_reader` (A: 448 px read at level 0 and resized; B: a
matching level), read natively, in batches of 64 model tiles in plan order:

- **client CPU ms per tile**: this thread's CPU time to read a batch and
  encode its V2 request body (``pixels``: decode, compose, resize, pack the
  raw tiles; ``jpeg``: gather each slide tile's bytes once, splice the
  tables, pack), over the whole slide;
- **bytes per tile**: the request bodies' length over the tiles;
- **server CPU ms per tile** (``jpeg``): the stage-1 work the server does
  instead (:class:`predictor.codecs.jpeg_input.JpegTiles`: libjpeg-turbo
  decode, compose, resize); the pixel path's stage 1 is a view.

The two transports alternate round by round (interleaved, best of
``--repeats``), so drift on the shared machine hits both alike. Results as
JSON (``--out``) and a Markdown table on stdout, the figures
``docs/cohorts.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.native_reader import write_slides

BATCH = 64


def client_pass(path: Path, transport: str) -> tuple[float, int, int, list[Any]]:
    """CPU seconds, body bytes and tiles for one pass over the slide; the jpeg batches."""
    from histoserve import wire
    from histoserve.slides.grid import plan_tiles, read_tiles
    from histoserve.slides.readers import SlideReader, resolve_mpp
    from histoserve.slides.tiff.wire_tiles import jpeg_batch

    with SlideReader.open(path, "native") as slide:
        plan = plan_tiles(slide, resolve_mpp(slide, None, None, 0.05), 0.5, 224, 0.05)
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
    from predictor.codecs.jpeg_input import JpegTiles
    from predictor.config import LimitsConfig

    start = time.thread_time()
    for batch in batches:
        tiles = JpegTiles(
            batch.streams, batch.layout.astype("int64"), LimitsConfig(), 224, "bicubic"
        )
        for box in batch.boxes:
            tiles.region(box)
    return time.thread_time() - start


def measure(paths: dict[str, Path], repeats: int) -> list[dict[str, Any]]:
    """One row per slide and transport."""
    rows = []
    for name, path in paths.items():
        best: dict[str, dict[str, float]] = {}
        for _ in range(repeats):
            for transport in ("pixels", "jpeg"):
                seconds, sent, n, batches = client_pass(path, transport)
                server = server_pass(batches) if batches else 0.0
                row = best.setdefault(transport, {"client": float("inf"), "server": float("inf")})
                row["client"] = min(row["client"], seconds)
                row["server"] = min(row["server"], server)
                row["bytes"], row["tiles"] = sent, n
        for transport, r in best.items():
            rows.append(
                {
                    "slide": name,
                    "transport": transport,
                    "tiles": r["tiles"],
                    "client_cpu_ms_per_tile": 1000 * r["client"] / r["tiles"],
                    "bytes_per_tile": r["bytes"] / r["tiles"],
                    "server_cpu_ms_per_tile": 1000 * r["server"] / r["tiles"],
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table of ``docs/cohorts.md``."""
    lines = [
        "| slide | transport | client CPU ms / tile | kB / tile on the wire | server CPU ms / tile |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['slide']} | {r['transport']} | {r['client_cpu_ms_per_tile']:.2f} | "
            f"{r['bytes_per_tile'] / 1000:.1f} | {r['server_cpu_ms_per_tile']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jpeg_transport", description=__doc__)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-jpeg-") as folder:
        rows = measure(write_slides(Path(folder)), args.repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
