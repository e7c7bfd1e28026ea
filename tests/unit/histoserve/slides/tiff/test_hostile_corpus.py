"""The native reader against OpenSlide on hostile slides: the same outcome, the same pixels.

Real slides (:mod:`harness.hostile_slides`: a 4 x 3 tile Aperio-style SVS with
shared ``JPEGTables``, one thing changed) read tile by tile with
``--reader auto`` (natively where it applies) and with OpenSlide
(``openslide-python``, OpenSlide 4.0.1). For every case: each tile is read
by both or refused by both (so a slide is done under one exactly when it is
under the other), and where OpenSlide reads a tile the pixels are equal.
Then what each bound costs: a sparse file declaring 16.7 M tiles is refused
before any reader opens it, inflated tables send the slide to OpenSlide, and
a jpeg request's bytes are bounded before a tile is read.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness import hostile_slides, jpeg_slides
from histoserve.errors import SlideError
from histoserve.limits import MAX_JPEG_TABLES_BYTES, MAX_TIFF_TILES
from histoserve.slides.readers import SlideReader
from histoserve.slides.tiff.checks import is_tiff
from histoserve.slides.tiff.native import NativeTiff
from histoserve.slides.tiff.wire_tiles import JpegTooLarge, jpeg_batch

TILE = hostile_slides.TILE
CELLS = [(column, row) for row in range(3) for column in range(4)]
BROKEN = (1, 1)  # hostile_slides.BROKEN_TILE, row-major
# Tile changes OpenSlide refuses (the slide is never done) and those it reads.
REFUSED = {
    "one-component", "four-component", "other-size", "declared-65500px", "zeros",
    "truncated", "corrupt-scan", "no-eoi",
}  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_slides.base_slide(tmp_path_factory.mktemp("hostile") / "base.svs")


def _read_all(path: Path, reader: str) -> tuple[str, dict[tuple[int, int], np.ndarray | str]]:
    """The backend and each tile's pixels, or the error that refused it."""
    out: dict[tuple[int, int], np.ndarray | str] = {}
    with SlideReader.open(path, reader) as slide:
        for column, row in CELLS:
            try:
                out[column, row] = slide.read_region((column * TILE, row * TILE), 0, (TILE, TILE))
            except SlideError as exc:
                out[column, row] = str(exc)
                slide.reopen()  # OpenSlide's error is sticky on its handle
        return slide.backend, out


def _agree(native: dict, reference: dict) -> None:
    for cell in CELLS:
        mine, theirs = native[cell], reference[cell]
        assert isinstance(mine, str) == isinstance(theirs, str), (cell, mine, theirs)
        if not isinstance(theirs, str):
            np.testing.assert_array_equal(mine, theirs, err_msg=str(cell))


@pytest.mark.parametrize("case", sorted(hostile_slides.TILE_CHANGES))
def test_native_and_openslide_agree_tile_by_tile(base: Path, tmp_path: Path, case: str) -> None:
    change = hostile_slides.TILE_CHANGES[case]
    path = hostile_slides.replace_tile(base, tmp_path / f"{case}.svs", 5, change)
    backend, native = _read_all(path, "auto")
    assert backend == "native"  # the change is past the first tile: read natively
    _, reference = _read_all(path, "openslide")
    _agree(native, reference)
    refused = isinstance(reference[BROKEN], str)
    assert refused == (case in REFUSED), reference[BROKEN]
    if refused:  # named: the file, the level and tile
        assert str(path) in native[BROKEN] and "level 0 tile (1, 1)" in native[BROKEN]
    others = [cell for cell in CELLS if cell != BROKEN]
    assert not any(isinstance(native[cell], str) for cell in others)  # the rest reads


def test_a_one_component_tile_is_refused_as_openslide_refuses_it(
    base: Path, tmp_path: Path
) -> None:
    """Issue 45, case 5: before, the native reader read it as grey (the slide done)."""
    path = hostile_slides.replace_tile(base, tmp_path / "grey.svs", 5, hostile_slides.one_component)
    with SlideReader.open(path, "auto") as slide:
        assert slide.backend == "native"
        with pytest.raises(SlideError, match=r"1 component\(s\) where the TIFF declares 3"):
            slide.read_region((TILE, TILE), 0, (TILE, TILE))
        with pytest.raises(SlideError, match="1 component"):  # never sent as a JPEG tile either
            jpeg_batch(slide.native, 0, 224, np.array([[TILE, TILE]]))


@pytest.fixture(scope="module")
def two_levels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = dataclasses.replace(hostile_slides.SPEC, downsamples=(1, 2))
    path = tmp_path_factory.mktemp("levels") / "two.svs"
    return jpeg_slides.jpeg_tiff(path, spec).path


def _read_level(path: Path, reader: str, level: int) -> tuple[str, dict]:
    """Each TIFF tile of ``level``, read at level-0 coordinates by ``reader``, or its error."""
    out: dict[tuple[int, int], np.ndarray | str] = {}
    with SlideReader.open(path, reader) as slide:
        width, height = slide.level_dimensions[level]
        down = round(slide.level_downsamples[level])
        for row in range(-(-height // TILE)):
            for column in range(-(-width // TILE)):
                xy = (column * TILE * down, row * TILE * down)
                try:
                    out[column, row] = slide.read_region(xy, level, (TILE, TILE))
                except SlideError as exc:
                    out[column, row] = str(exc)
                    slide.reopen()
        return slide.backend, out


@pytest.mark.parametrize(("level", "index"), [(0, 5), (0, 0), (1, 1)])
def test_a_missing_tile_reads_as_openslide_reads_it(
    two_levels: Path, tmp_path: Path, level: int, index: int
) -> None:
    """Issue 53, case 8: a tile whose TileByteCounts is 0. OpenSlide reads it (white at level
    0; rendered from level 0 at an Aperio level above) and the slide is done; the native
    reader failed the slide ("no JPEG start-of-image marker") unless it was a level's first.
    Now both read it alike, and it is never sent as a JPEG tile."""
    path = hostile_slides.empty_tile(two_levels, tmp_path / "missing.svs", index, level)
    backend, native = _read_level(path, "auto", level)
    assert backend == "native"  # even when the missing tile is the level's first
    _, reference = _read_level(path, "openslide", level)
    assert not any(isinstance(v, str) for v in (*native.values(), *reference.values()))
    for cell, pixels in reference.items():
        np.testing.assert_array_equal(native[cell], pixels, err_msg=str(cell))
    with SlideReader.open(path, "auto") as slide:
        columns = -(-slide.level_dimensions[level][0] // TILE)
        cell = (index % columns, index // columns)
        if level == 0:  # nothing finer to render it from: OpenSlide's transparent, on white
            assert (native[cell] == 255).all()
            reduced = slide.read_reduced((cell[0] * TILE, cell[1] * TILE), 0, (TILE, TILE), 2)
            assert reduced.shape == (TILE // 2, TILE // 2, 3) and (reduced == 255).all()
        down = round(slide.level_downsamples[level])
        origin = np.array([[cell[0] * TILE * down, cell[1] * TILE * down]])
        with pytest.raises(SlideError, match=r"missing tile .*sent as pixels"):
            jpeg_batch(slide.native, level, 224, origin)


def test_inflated_tables_send_the_slide_to_openslide(base: Path, tmp_path: Path) -> None:
    """Issue 45, case 3: tables padded past the limit (copied into every tile) are not read
    natively; OpenSlide reads the slide, with the same pixels as the unpadded one."""
    path = hostile_slides.padded_tables(base, tmp_path / "tables.svs", 2 * MAX_JPEG_TABLES_BYTES)
    backend, padded = _read_all(path, "auto")
    assert backend == "openslide"
    _agree(padded, _read_all(base, "openslide")[1])
    with pytest.raises(SlideError, match=f"more than the {MAX_JPEG_TABLES_BYTES:,} allowed"):
        SlideReader.open(path, "native")


def test_a_jpeg_request_is_bounded_before_its_tiles_are_read(base: Path, tmp_path: Path) -> None:
    """Issue 45, case 3: the bytes a request would carry come from the declared byte counts;
    over the limit, JpegTooLarge (the batch goes as pixels) before a tile is read."""
    path = tmp_path / "padded.svs"
    shutil.copyfile(base, path)
    for index in range(len(CELLS)):  # every tile 0.5 MB larger, each still a valid JPEG
        hostile_slides.replace_tile(path, path, index, _pad(500_000))
    native = NativeTiff.open(path)
    try:
        one = np.array([[TILE // 2, TILE // 2]])  # one model tile over four slide tiles: 2 MB
        reads = []
        native.tile_bytes = lambda *a: reads.append(a)  # type: ignore[method-assign]
        with pytest.raises(JpegTooLarge, match="sent as pixels"):
            jpeg_batch(native, 0, 224, one)
        assert reads == []
    finally:
        native.close()
    with SlideReader.open(path, "auto") as slide:  # the pixels themselves are OpenSlide's
        assert slide.backend == "native"
        mine = slide.read_region((0, 0), 0, (2 * TILE, TILE))
    with SlideReader.open(path, "openslide") as slide:
        np.testing.assert_array_equal(mine, slide.read_region((0, 0), 0, (2 * TILE, TILE)))


def _pad(extra: int):
    def change(data: bytes) -> bytes:
        return hostile_slides.comment_padded(data, extra)

    return change


def test_a_sparse_file_declaring_millions_of_tiles_is_refused_before_any_reader_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45, case 4: 16.7 M declared tiles in a 4 KiB sparse file. Before, OpenSlide
    opened it (13 s and 600 MB here, 114 s and 674 MB reported; twice under auto)."""
    import openslide
    import tiffslide

    path = hostile_slides.sparse_tiles(tmp_path / "sparse.tif")
    assert path.stat().st_blocks * 512 <= 64 << 10  # a few KiB on disk
    opened = []

    def refuse(*args: object, **kwargs: object) -> None:
        opened.append(args)
        raise AssertionError("a reader opened it")

    monkeypatch.setattr(openslide, "OpenSlide", refuse)
    monkeypatch.setattr(tiffslide, "TiffSlide", refuse)
    for reader in ("auto", "openslide", "native"):
        with pytest.raises(SlideError, match=f"more than {MAX_TIFF_TILES:,} tiles") as caught:
            SlideReader.open(path, reader)
        assert str(caught.value).startswith(f"slide {path}: ")
    assert opened == []


SPARSE_FORMATS = {
    "classic-II": ("<", False),
    "classic-MM": (">", False),
    "bigtiff-II": ("<", True),
    "bigtiff-MM": (">", True),
}


@pytest.mark.parametrize("name", ["sparse.dat", "sparse", "sparse.png"])
@pytest.mark.parametrize("form", sorted(SPARSE_FORMATS))
def test_a_sparse_tiff_is_refused_whatever_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str, name: str
) -> None:
    """Issue 53, case 7: the bounds applied only to files with a TIFF suffix; OpenSlide knows a
    TIFF by its bytes (the same 4 KiB sparse file named ``.dat`` took it 68 s and 611 MB).
    2,050^2 declared tiles: just over the limit, so tifffile's pass stays cheap."""
    import openslide
    import tiffslide

    byteorder, bigtiff = SPARSE_FORMATS[form]
    path = hostile_slides.sparse_tiles(
        tmp_path / name, tiles_per_edge=2050, byteorder=byteorder, bigtiff=bigtiff
    )
    assert is_tiff(path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a reader opened it")

    monkeypatch.setattr(openslide, "OpenSlide", refuse)
    monkeypatch.setattr(tiffslide, "TiffSlide", refuse)
    with pytest.raises(SlideError, match=f"more than {MAX_TIFF_TILES:,} tiles"):
        SlideReader.open(path, "auto")


@pytest.mark.parametrize(("byteorder", "bigtiff"), list(SPARSE_FORMATS.values()))
def test_a_tiff_is_known_by_its_magic_bytes(tmp_path: Path, byteorder: str, bigtiff: bool) -> None:
    """What tifffile writes, in each byte order and both forms, is a TIFF; a JPEG and a PNG
    with a TIFF's name are not, nor is a folder or a missing file."""
    import tifffile
    from PIL import Image

    path = tmp_path / "any.bin"
    tifffile.imwrite(path, np.zeros((8, 8, 3), np.uint8), byteorder=byteorder, bigtiff=bigtiff)
    assert is_tiff(path)
    for kind in ("JPEG", "PNG"):
        other = tmp_path / f"not-{kind}.tif"
        Image.new("RGB", (8, 8)).save(other, kind)
        assert not is_tiff(other)
    assert not is_tiff(tmp_path) and not is_tiff(tmp_path / "missing.tif")


def test_auto_opens_openslide_once_for_a_slide_it_does_not_read_natively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openslide

    from harness import slides

    path = slides.generic_tiff(tmp_path / "deflate.tif").path
    real, opened = openslide.OpenSlide, []

    def counting(*args: object) -> object:
        opened.append(args)
        return real(*args)

    monkeypatch.setattr(openslide, "OpenSlide", counting)
    with SlideReader.open(path, "auto") as slide:
        assert slide.backend == "openslide"
    assert len(opened) == 1
