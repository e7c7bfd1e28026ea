"""Open a whole-slide image and find its level-0 microns per pixel, never by guessing.

:class:`SlideReader` wraps OpenSlide (the self-contained ``openslide-bin``
wheel: svs, ndpi, mrxs, scn, tiff, DICOM WSI given as a folder of ``.dcm``
files or one of them, ...) and falls back to ``tiffslide`` (pure Python) for
files OpenSlide does not open. Zeiss ``.czi`` files are read with
``pylibCZIrw`` (:mod:`~histoserve.slides.readers_czi`). ``reader="auto"``
or ``"native"`` reads JPEG-tiled TIFF and Aperio SVS directly
(:mod:`~histoserve.slides.tiff.native`, OpenSlide's pixels). A TIFF whose tile data runs past
the end of the file (a broken copy) is refused at open with a clear message,
because tiffslide would otherwise open it and fail tile by tile. Backend
errors become :class:`~histoserve.errors.SlideError` so that one bad
slide fails alone.

The mpp comes from, in order: ``--mpp-override``, the manifest's ``mpp``
column, the reader's ``openslide.mpp-x``/``-y`` (``tiffslide.mpp-*``; a CZI's
``czi.mpp-*`` from its scaling metadata; DICOM's Pixel Spacing), the
Aperio ``MPP`` in the description, the TIFF resolution tags with their unit.
None of them, non-square pixels, or an implausible value (72 dpi screen
defaults) is a SlideError that says which flag or column gives it.

The backends are imported when a slide is opened, not when this module is.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from histoserve.errors import SlideError

# Level-0 mpp read from metadata must lie here; outside it the tags are a
# writer's default (72 dpi is 352.8 um/px), not a microscope's scale. The same
# range holds --mpp-override, --target-mpp and the manifest's mpp column.
from histoserve.limits import PLAUSIBLE_MPP
from histoserve.slides.tiff.checks import check_tiff_complete
from histoserve.slides.tiff.native import on_white

_FIX = "give it with --mpp-override X or the manifest's mpp column"
_BACKENDS = ("openslide", "tiffslide", "czi", "native")
READERS = ("auto", "openslide", "native")
"""``--reader``: native where it applies (auto), never, or always (a slide it cannot read fails)."""


class SlideReader:
    """One open slide: geometry, properties and RGB regions.

    Attributes:
        path: The slide file.
        backend: ``"openslide"``, ``"tiffslide"``, ``"czi"`` or ``"native"``.
        dimensions: Level-0 ``(w, h)``.
        level_dimensions: ``(w, h)`` per level.
        level_downsamples: Downsample of each level relative to level 0.
        properties: The backend's properties (``openslide.*`` / ``tiffslide.*``,
            vendor keys, ``tiff.*``).

    Not thread-safe for :meth:`reopen`/:meth:`close`; ``read_region`` may be
    called from several threads with the OpenSlide backend (OpenSlide is
    thread-safe); with tiffslide use one reader per thread.
    """

    def __init__(
        self, handle: Any, path: Path, backend: str, properties: Mapping[str, str] | None = None
    ) -> None:
        """Wrap an open backend handle; ``properties`` replaces the handle's (tests only).

        Use :meth:`open`. ``properties`` exists because no slide format that can
        be written here carries ``openslide.bounds-*`` (MRXS, SCN writers don't
        exist in Python), so bounds tests inject them beside a real file.
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        self._handle = handle
        self.path = Path(path)
        self.backend = backend
        self.level_dimensions = tuple((int(w), int(h)) for w, h in handle.level_dimensions)
        self.level_downsamples = tuple(float(d) for d in handle.level_downsamples)
        self.dimensions = self.level_dimensions[0]
        if properties is None:
            properties = {k: str(v) for k, v in handle.properties.items() if v is not None}
        self.properties: Mapping[str, str] = dict(properties)

    @classmethod
    def open(cls, path: Path, reader: str = "openslide", cache: Any = None) -> SlideReader:
        """Open ``path`` with OpenSlide, else tiffslide (``.czi``: pylibCZIrw; a folder: DICOM).

        ``reader`` (one of ``READERS``): ``auto`` reads natively where
        :mod:`~histoserve.slides.tiff.native` applies, ``native`` only so;
        ``cache``: a shared :class:`~histoserve.slides.tiff.native.TileCache`.

        Raises:
            SlideError: The file is missing, truncated, or neither backend opens
                it; ``native`` on a slide the native reader cannot read (why).
        """
        path = Path(path)
        if reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
        if path.suffix.lower() == ".czi" and path.is_file():
            return cls(_open_czi(path), path, "czi")
        if not _openslide_target(path).is_file():
            raise SlideError(f"slide file not found: {path} (a folder must hold DICOM files)")
        check_tiff_complete(path)  # also its declared pages, tiles and pixels, before any backend
        handle, backend, first_error = _open_openslide(path), "openslide", None
        opened = not isinstance(handle, Exception)
        if reader == "native" or (reader == "auto" and opened):  # one OpenSlide open for both
            native = _open_native(path, cache, reader == "native", handle if opened else None)
            if native is not None:
                return cls(native, path, "native")
        if isinstance(handle, Exception):
            first_error, handle, backend = handle, _open_tiffslide(path), "tiffslide"
        if isinstance(handle, Exception):
            raise SlideError(
                f"cannot open slide {path}: OpenSlide: {first_error}; tiffslide: {handle}; "
                "check the file is a whole-slide image and was copied completely"
            ) from handle
        return cls(handle, path, backend)

    def __enter__(self) -> SlideReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def bounds(self) -> tuple[int, int, int, int]:
        """Level-0 ``(x, y, w, h)`` of the scanned area (``*.bounds-*``), else the whole slide.

        Bounds are clipped to level 0 (a tile outside it cannot be read); bounds
        that are missing, partial or not numbers count as none.
        """
        width, height = self.dimensions
        for prefix in ("openslide", "tiffslide"):
            keys = [f"{prefix}.bounds-{k}" for k in ("x", "y", "width", "height")]
            values = [_number(self.properties.get(k)) for k in keys]
            if any(v is None for v in values):
                continue
            x, y, w, h = (int(v) for v in values)  # type: ignore[arg-type]
            x0, y0 = min(max(x, 0), width), min(max(y, 0), height)
            return x0, y0, max(0, min(x + w, width) - x0), max(0, min(y + h, height) - y0)
        return 0, 0, width, height

    def read_region(
        self, xy_level0: tuple[int, int], level: int, size: tuple[int, int]
    ) -> np.ndarray:
        """Read ``size`` px at ``level`` from level-0 ``xy``: uint8 ``[h, w, 3]`` RGB on white.

        Transparent pixels (outside the scanned area) are composited on white,
        as a scanner's background would be.

        Raises:
            SlideError: The backend fails on this region (corrupt or missing tile data).
        """
        x, y = int(xy_level0[0]), int(xy_level0[1])
        try:
            if self.backend in ("openslide", "czi", "native"):
                region = np.asarray(self._handle.read_region((x, y), level, size))
            else:
                region = np.asarray(self._handle.read_region((x, y), level, size, as_array=True))
        except SlideError:
            raise
        except Exception as exc:  # the backends raise many types for a corrupt tile
            raise SlideError(
                f"slide {self.path}: cannot read region x={x} y={y} level={level} size={size}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return _to_rgb(region)

    @property
    def native(self) -> Any:
        """The :class:`~histoserve.slides.tiff.native.NativeTiff` when read natively, else None."""
        return self._handle if self.backend == "native" else None

    def read_reduced(
        self, xy_level0: tuple[int, int], level: int, size: tuple[int, int], factor: int
    ) -> np.ndarray:
        """``size`` px at ``level`` decoded at 1/``factor`` (native reader only; ``--resize reduced``).

        Raises:
            SlideError: Not read natively, or a tile cannot be decoded.
        """
        if self.backend != "native":
            raise SlideError(f"slide {self.path}: a reduced-scale decode needs the native reader")
        return self._handle.read_reduced(xy_level0, level, size, factor)

    def reopen(self) -> None:
        """Replace the handle with a fresh one (after a read error OpenSlide's handle is dead)."""
        old = self._handle
        if self.backend in ("czi", "native"):
            if self.backend == "czi":
                self._handle = _open_czi(self.path)
            else:  # the same decoded-tile cache: a fresh handle, the same slide
                self._handle = _open_native(self.path, old.cache, True)
            _close_quietly(old)
            return
        fresh = _open_openslide(self.path) if self.backend == "openslide" else None
        if fresh is None or isinstance(fresh, Exception):
            fresh = _open_tiffslide(self.path)
        if isinstance(fresh, Exception):
            raise SlideError(f"cannot reopen slide {self.path}: {fresh}") from fresh
        self._handle = fresh
        _close_quietly(old)

    def close(self) -> None:
        """Release the backend handle."""
        _close_quietly(self._handle)


def _close_quietly(handle: Any) -> None:
    # Closing a handle that failed must not mask the original error.
    with contextlib.suppress(Exception):
        handle.close()


def _to_rgb(region: np.ndarray) -> np.ndarray:
    if region.ndim == 2:
        return np.repeat(region[:, :, None], 3, axis=2).astype(np.uint8, copy=False)
    if region.shape[2] == 3:
        return np.ascontiguousarray(region, dtype=np.uint8)
    return on_white(region)


def _openslide_target(path: Path) -> Path:
    """The file OpenSlide opens for ``path``: itself, or a DICOM instance of a folder."""
    if not path.is_dir():
        return path
    from histoserve.slides.readers_dicom import dicom_instance

    return dicom_instance(path) or path


def _open_czi(path: Path) -> Any:
    from histoserve.slides.readers_czi import CziHandle

    try:
        return CziHandle.open(path)
    except Exception as exc:  # pylibCZIrw raises RuntimeError and others for a bad file
        raise SlideError(f"cannot open CZI slide {path}: {type(exc).__name__}: {exc}") from exc


def _open_native(path: Path, cache: Any, required: bool, slide: Any = None) -> Any:
    """A :class:`~histoserve.slides.tiff.native.NativeTiff`, else None (SlideError if required).

    ``slide``: the OpenSlide handle already open, if any (it stays the caller's when None).
    """
    from histoserve.slides.tiff.native import NativeTiff, NotNative

    try:
        return NativeTiff.open(path, cache, slide)
    except NotNative as exc:
        if required:
            raise SlideError(
                f"slide {path}: --reader native cannot read it: {exc}; use --reader auto "
                "(OpenSlide where the native reader does not apply) or --reader openslide"
            ) from exc
        return None


def _open_openslide(path: Path) -> Any:
    try:
        import openslide

        return openslide.OpenSlide(str(_openslide_target(path)))
    except Exception as exc:  # unsupported format, corrupt file, missing library
        return exc


def _open_tiffslide(path: Path) -> Any:
    try:
        import tiffslide

        return tiffslide.TiffSlide(path)
    except Exception as exc:  # tifffile raises many types on a non-TIFF or broken file
        return exc


@dataclass(frozen=True)
class MppInfo:
    """Level-0 microns per pixel and where it came from.

    Attributes:
        mpp: Level-0 microns per pixel.
        source: ``override``, ``manifest``, ``openslide.mpp``, ``aperio.MPP`` or
            ``tiff.resolution``.
    """

    mpp: float
    source: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mpp) and self.mpp > 0):
            raise SlideError(f"mpp must be a positive number, got {self.mpp} (from {self.source})")


def resolve_mpp(
    reader: SlideReader, override: float | None, manifest_mpp: float | None, tolerance: float
) -> MppInfo:
    """The level-0 mpp of ``reader``'s slide: override, manifest, metadata, TIFF tags.

    Raises:
        SlideError: No source gives one, x and y differ by more than
            ``tolerance`` (relative), or the metadata value is implausible.
    """
    if override is not None:
        return MppInfo(float(override), "override")
    if manifest_mpp is not None:
        return MppInfo(float(manifest_mpp), "manifest")
    return mpp_from_properties(reader.properties, tolerance, str(reader.path))


def mpp_from_properties(props: Mapping[str, str], tolerance: float, where: str) -> MppInfo:
    """The level-0 mpp from slide properties alone (metadata, then TIFF tags).

    Raises:
        SlideError: As :func:`resolve_mpp`.
    """
    for prefix in ("openslide", "tiffslide", "czi"):
        pair = _number(props.get(f"{prefix}.mpp-x")), _number(props.get(f"{prefix}.mpp-y"))
        if pair[0] is not None or pair[1] is not None:
            source = "czi.mpp" if prefix == "czi" else "openslide.mpp"
            return _checked(pair, source, f"{prefix}.mpp-x/-y", tolerance, where)
    aperio = _number(props.get("aperio.MPP"))
    if aperio is not None:
        return _checked((aperio, aperio), "aperio.MPP", "aperio.MPP", tolerance, where)
    tags = _mpp_from_tiff_tags(props)
    if tags is not None:
        return _checked(tags, "tiff.resolution", "TIFF resolution tags", tolerance, where)
    raise SlideError(
        f"slide {where} has no microns-per-pixel: no openslide.mpp-x/-y, no Aperio MPP, "
        f"no TIFF resolution tags with a unit; {_FIX}"
    )


def _number(value: object) -> float | None:
    if value in (None, "", "None"):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _mpp_from_tiff_tags(props: Mapping[str, str]) -> tuple[float | None, float | None] | None:
    unit = str(props.get("tiff.ResolutionUnit", "")).lower()
    per_unit = {"centimeter": 1e4, "inch": 25400.0}.get(unit)
    xres, yres = _number(props.get("tiff.XResolution")), _number(props.get("tiff.YResolution"))
    if per_unit is None or not xres or not yres or xres <= 0 or yres <= 0:
        return None
    return per_unit / xres, per_unit / yres


def _checked(
    pair: tuple[float | None, float | None], source: str, label: str, tolerance: float, where: str
) -> MppInfo:
    x, y = pair
    if x is None or y is None:
        raise SlideError(f"slide {where}: {label} gives only one of x and y ({x}, {y}); {_FIX}")
    low, high = PLAUSIBLE_MPP
    if not (low <= x <= high and low <= y <= high):
        raise SlideError(
            f"slide {where}: {label} say {x:g} x {y:g} um/px, outside {low}..{high} "
            f"(a writer's default, not a scanner's scale); {_FIX}"
        )
    if abs(x - y) > tolerance * max(x, y):
        raise SlideError(
            f"slide {where}: {label} give non-square pixels, x={x:g} y={y:g} um/px "
            f"(beyond --mpp-tolerance {tolerance:g}); if one value is right, {_FIX}"
        )
    return MppInfo(x, source)
