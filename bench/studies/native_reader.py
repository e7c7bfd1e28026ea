"""``python -m bench.studies.native_reader``: the client's CPU per model tile by reader and resize.

Not part of ``make bench`` (about a minute, one core). Two generated
Aperio-style SVS (JPEG q90, 256 px tiles, tables in ``JPEGTables``, the real
H&E texture over the whole slide), 0.25 um/px, read for a 224 px tile at
0.5 um/px:

- **slide A**, levels 1/16: no 0.5 um/px level, so 448 px is read at level 0
  and resized to 224 (the common case: a 40x scan, a 20x model);
- **slide B**, levels 1/2/16: level 1 matches, tiles are read as they are.

For each of OpenSlide + bicubic (the path before the native reader), native
+ bicubic, native + area and native + reduced: CPU ms per model tile (this
thread's CPU time over every tile of the slide in plan order, a fresh reader
each time, best of ``--repeats``), and the fidelity of the tiles to
OpenSlide + bicubic's: cosine similarity of the pixel vectors and PSNR (dB;
``inf``: the same pixels). Results as JSON (``--out``) and a Markdown table on
stdout, the figures ``docs/cohorts.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.markdown import table

EDGE = 4480  # level-0 px: 10 x 10 model tiles of 448 px (A) or 224 px at level 1 (B)
CASES = (
    ("openslide", "bicubic"),
    ("native", "bicubic"),
    ("native", "area"),
    ("native", "reduced"),
)


def write_slides(folder: Path, edge: int = EDGE) -> dict[str, Path]:
    """Slides A (levels 1/16) and B (levels 1/2/16), all tissue, ``edge`` px square at level 0."""
    from harness.jpeg_slides import jpeg_tiff
    from harness.slides import SlideSpec

    out = {}
    for name, downsamples in (("A", (1, 16)), ("B", (1, 2, 16))):
        spec = SlideSpec(
            width=edge,
            height=edge,
            boxes=((0, 0, edge, edge),),
            mpp=(0.25, 0.25),
            vendor="aperio",
            downsamples=downsamples,
        )
        out[name] = jpeg_tiff(folder / f"{name}.svs", spec).path
    return out


def read_all(path: Path, reader: str, resize: str) -> tuple[np.ndarray, float]:
    """Every model tile of the slide in plan order, and the CPU seconds it took."""
    from histoserve.slides.grid import plan_tiles, read_tiles
    from histoserve.slides.readers import SlideReader, resolve_mpp

    with SlideReader.open(path, reader) as slide:
        plan = plan_tiles(
            slide, resolve_mpp(slide, None, None, 0.05), 0.5, 224, 0.05, resize=resize
        )
        start = time.thread_time()
        tiles = read_tiles(slide, plan, plan.coords)
        return tiles, time.thread_time() - start


def fidelity(tiles: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Cosine similarity of the pixel vectors and PSNR (dB) of ``tiles`` to ``reference``."""
    a, b = tiles.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    mse = float(np.mean((a - b) ** 2))
    return cosine, float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def measure(paths: dict[str, Path], repeats: int) -> list[dict[str, Any]]:
    """One row per slide and case: ms per tile, cosine and PSNR to OpenSlide + bicubic."""
    rows = []
    for name, path in paths.items():
        reference = None
        for reader, resize in CASES:
            if name == "B" and resize != "bicubic":
                continue  # a matching level is never resized: the same pixels
            best, tiles = float("inf"), None
            for _ in range(repeats):
                tiles, seconds = read_all(path, reader, resize)
                best = min(best, seconds)
            reference = tiles if reference is None else reference
            cosine, psnr = fidelity(tiles, reference)
            rows.append(
                {
                    "slide": name,
                    "reader": reader,
                    "resize": resize,
                    "tiles": len(tiles),
                    "cpu_ms_per_tile": 1000 * best / len(tiles),
                    "cosine_to_bicubic": cosine,
                    "psnr_to_bicubic_db": psnr,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table of ``docs/cohorts.md``."""
    header = (
        "slide",
        "reader + resize",
        "CPU ms / tile",
        "cosine to OpenSlide+bicubic",
        "PSNR (dB)",
    )
    cells = [
        (
            r["slide"],
            f"{r['reader']} + {r['resize']}",
            r["cpu_ms_per_tile"],
            f"{r['cosine_to_bicubic']:.5f}",
            "identical"
            if r["psnr_to_bicubic_db"] == float("inf")
            else f"{r['psnr_to_bicubic_db']:.1f}",
        )
        for r in rows
    ]
    return "\n".join(table(header, cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.native_reader", description=__doc__
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-native-") as folder:
        rows = measure(write_slides(Path(folder)), args.repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
