"""Property-based fuzzing of the native reader's parsers: TIFF directories and JPEG headers.

Three targets, each on a real slide (:func:`harness.hostile_slides.base_slide`)
changed at random by hypothesis:

- the TIFF directories (header, IFD, tag values: the file's first 1,120
  bytes): the completeness and size check before any reader
  (:func:`~histoserve.slides.tiff.checks.check_tiff_complete`) and the native
  reader's reading of each level's directory may refuse only as they say
  (``SlideError``, ``NotNative``), never with another exception or a hang;
- one tile's JPEG headers (SOI to the scan): splitting the segments, the
  first-tile check, building a tile's stream with its frame checked, and
  decoding, may refuse only with ``JpegTileError``, and never decode to
  another size than the TIFF's;
- the same tile read through the slide by the native reader and by
  OpenSlide: both read it (the same pixels) or both refuse it.

``make test`` runs a short deterministic pass (``HISTOSERVE_FUZZ_EXAMPLES``,
default 40); ``make test-long`` runs each target with
``HISTOSERVE_FUZZ_LONG_EXAMPLES`` examples (default 20,000: about 5 minutes here).
OpenSlide is only given changed tiles, never changed directories: libtiff
parsing hostile directories in the test process is not what is tested here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import hostile_slides
from histoserve.errors import SlideError
from histoserve.slides.readers import SlideReader
from histoserve.slides.tiff import native
from histoserve.slides.tiff.checks import check_tiff_complete
from histoserve.slides.tiff.jpeg_tiles import (
    JpegTileError,
    decode_tile,
    jpeg_problem,
    segments,
    tile_stream,
)

EXAMPLES = int(os.environ.get("HISTOSERVE_FUZZ_EXAMPLES", "40"))
LONG_EXAMPLES = int(os.environ.get("HISTOSERVE_FUZZ_LONG_EXAMPLES", "20000"))
SHORT = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
LONG = settings(SHORT, max_examples=LONG_EXAMPLES, derandomize=False)
TILE = hostile_slides.TILE
DIRECTORY_BYTES = 1120  # header, IFD and tag values of the base slide (tifffile writes them first)
INTERESTING = (0, 1, 2, 3, 7, 8, 16, 0x7F, 0x80, 0xFF)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_slides.base_slide(tmp_path_factory.mktemp("fuzz-tiff") / "base.svs")


def _edits(limit: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    value = st.sampled_from(INTERESTING) | st.integers(0, 255)
    return st.lists(st.tuples(st.integers(0, limit - 1), value), min_size=1, max_size=8)


def _edited(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, value in edits:
        out[at % len(out)] = value
    return bytes(out)


def _tile_and_tables(base: Path) -> tuple[bytes, bytes]:
    handle = native.NativeTiff.open(base)
    try:
        return handle.tile_bytes(0, 1, 1), handle.jpeg_tables(0) or b""
    finally:
        handle.close()


def _header_length(tile: bytes) -> int:
    own, _ = segments(tile)
    return 2 + sum(len(seg) for _, seg in own) + 14  # through the scan header


# -- the TIFF directories ---------------------------------------------------------------------


def _directories_hold(base: Path, edits: list[tuple[int, int]], tmp: Path) -> None:
    path = tmp / "fuzzed.svs"
    data = base.read_bytes()
    path.write_bytes(_edited(data[:DIRECTORY_BYTES], edits) + data[DIRECTORY_BYTES:])
    try:
        check_tiff_complete(path)
    except SlideError as exc:
        assert str(path) in str(exc)
    with contextlib.suppress(native.NotNative):  # bounded alone too (a file the check skips)
        native._levels(path, _OpenSlideMeta())


class _OpenSlideMeta:
    """What the native reader takes from OpenSlide's open of the unchanged slide (vendor,
    levels): OpenSlide itself is not run on fuzzed directories (see the module)."""

    properties: ClassVar[dict[str, str]] = {"openslide.vendor": "aperio"}
    level_dimensions = ((4 * TILE, 3 * TILE),)


@SHORT
@given(_edits(DIRECTORY_BYTES))
def test_fuzzed_directories_are_refused_only_as_said(base: Path, edits) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _directories_hold(base, edits, Path(tmp))


@pytest.mark.slow
@LONG
@given(_edits(DIRECTORY_BYTES))
def test_fuzzed_directories_long(base: Path, edits) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _directories_hold(base, edits, Path(tmp))


# -- one tile's JPEG headers -------------------------------------------------------------------


def _headers_hold(base: Path, edits: list[tuple[int, int]], cut: int | None) -> None:
    tile, tables = _tile_and_tables(base)
    data = _edited(tile[: _header_length(tile)], edits) + tile[_header_length(tile) :]
    data = data[:cut] if cut is not None else data
    problem = jpeg_problem(tables, data)
    assert problem is None or isinstance(problem, str)
    try:
        stream = tile_stream(tables, data, TILE, TILE)
    except JpegTileError:
        return
    try:
        pixels = decode_tile(stream, TILE, TILE)
    except JpegTileError:
        return
    assert pixels.shape == (TILE, TILE, 3) and pixels.dtype == np.uint8


@SHORT
@given(_edits(600), st.none() | st.integers(0, 4000))
def test_fuzzed_jpeg_headers_are_refused_only_as_said(base: Path, edits, cut) -> None:
    _headers_hold(base, edits, cut)


@pytest.mark.slow
@LONG
@given(_edits(600), st.none() | st.integers(0, 4000))
def test_fuzzed_jpeg_headers_long(base: Path, edits, cut) -> None:
    _headers_hold(base, edits, cut)


# -- the same tile through the native reader and OpenSlide --------------------------------------


def _same_as_openslide(base: Path, edits: list[tuple[int, int]], tmp: Path) -> None:
    def change(tile: bytes) -> bytes:
        return _edited(tile[: _header_length(tile)], edits) + tile[_header_length(tile) :]

    path = hostile_slides.replace_tile(base, tmp / "tile.svs", 5, change)
    shutil.copyfile(path, tmp / "again.svs")  # a fresh file: no reader state shared
    outcomes = []
    for reader, where in (("native", path), ("openslide", tmp / "again.svs")):
        with SlideReader.open(where, reader) as slide:
            try:
                outcomes.append(slide.read_region((TILE, TILE), 0, (TILE, TILE)))
            except SlideError as exc:
                outcomes.append(str(exc))
    mine, theirs = outcomes
    assert isinstance(mine, str) == isinstance(theirs, str), (mine, theirs)
    if not isinstance(theirs, str):
        np.testing.assert_array_equal(mine, theirs)


@SHORT
@given(_edits(600))
def test_a_fuzzed_tile_reads_as_openslide_reads_it(base: Path, edits) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _same_as_openslide(base, edits, Path(tmp))


@pytest.mark.slow
@LONG
@given(_edits(600))
def test_a_fuzzed_tile_reads_as_openslide_reads_it_long(base: Path, edits) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _same_as_openslide(base, edits, Path(tmp))
