"""One slide, start to finish: plan, tissue, read ahead, send, assemble, write.

:func:`embed_slide` turns a :class:`~histoserve.slides.manifest.SlideEntry`
into ``<out>/<slide_id>.h5`` or raises: a
:class:`~histoserve.errors.SlideError` (unreadable slide, no mpp, bad
bulk RNA) or a :class:`~histoserve.remote.dispatch.RequestFailed` (a 4xx, or
retries used up). The caller records either as ``failed`` and goes on with the
next slide.

Corrupt tile regions: each reader thread has its own slide handle. A batch
whose read fails is read again tile by tile on a fresh handle
(``reader.reopen()``: OpenSlide keeps an error sticky on its handle); a tile
that fails twice is recorded as bad and left out of the output. Its
coordinates are written to the file (``bad_coords`` attribute), and the slide
is reported ``failed`` with their count. Such a file goes to
``<out>/incomplete/<slide_id>.h5`` with ``complete = False``, never to the
final name: no resume check and no loader globbing ``<out>/*.h5`` takes it,
and the next run tries the slide again (see :class:`CorruptTiles`). Only with
``--accept-bad-tiles N`` is a slide with at most N bad tiles written to its
final name and reported done (its ``n_bad_tiles`` and ``bad_coords`` say so).

QC: once the tiles are planned, ``<out>/qc/<slide_id>.{jpg,geojson,json}``
are written (:mod:`~histoserve.review.qc`), and again with the bad
tiles drawn when there are any.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.embedding.batches import Assembled, BatchStats, run_batches
from histoserve.embedding.config import EmbedConfig
from histoserve.embedding.tissue_remote import model_tissue_mask
from histoserve.embedding.tracing import RunTracer
from histoserve.errors import EmbedError, RequestFailed, SlideError
from histoserve.remote.answers import AnswerCheck
from histoserve.remote.client import HistoserveClient
from histoserve.remote.served_model import ServerInfo
from histoserve.results.layouts import Layout
from histoserve.results.output import SlideResult, plan_attrs
from histoserve.review.qc import write_slide_qc
from histoserve.slides.grid import (
    TilePlan,
    interpolation_of,
    plan_tiles,
    read_tile,
    read_tiles,
)
from histoserve.slides.manifest import SlideEntry
from histoserve.slides.readers import MppInfo, SlideReader, resolve_mpp
from histoserve.slides.tiff.native import TileCache
from histoserve.slides.tiff.wire_tiles import (
    JpegBatch,
    choose_transport,
    jpeg_batch,
    jpeg_problem,
    pixels_may_help,
)
from histoserve.tissue.detect import THUMB_MPP, thumbnail
from histoserve.tissue.masks import TissueMap, find_tissue, mask_file
from histoserve.wire import MODE_OUTPUTS

logger = logging.getLogger("histoserve.embed")


class CorruptTiles(EmbedError):
    """Some tiles could not be read even on a fresh handle; the rest were written (incomplete).

    ``bad``: their level-0 ``(x, y)``.
    """

    def __init__(self, message: str, bad: np.ndarray):
        super().__init__(message)
        self.bad = bad


@dataclass(frozen=True)
class RunContext:
    """What every slide of a run shares.

    Attributes:
        config: The run's options.
        info: The embedding model as the server describes it.
        tissue_info: The tissue-segmentation model (``--tissue MODEL``), else None.
        target_mpp: Microns per pixel of the tiles.
        tile_size: Tile edge (px).
        client: Sends requests for the model (retried, every answer checked).
        tissue_client: Sends requests for the tissue model (None: otsu/none).
        base_attrs: Attributes every output file carries (model, spec, version, ...).
        in_flight: Bounds requests in flight over every slide of the run
            (``--concurrency``), whatever the number of slides in progress.
        layout: Where and how slides are written (``--layout``).
        tracer: The run's traces (``--otel-endpoint``), else None.
    """

    config: EmbedConfig
    info: ServerInfo
    tissue_info: ServerInfo | None
    target_mpp: float
    tile_size: int
    client: HistoserveClient
    tissue_client: HistoserveClient | None
    base_attrs: Mapping[str, Any]
    in_flight: threading.Semaphore
    layout: Layout
    tracer: RunTracer | None = None


@dataclass(frozen=True)
class SlideOutcome:
    """A written slide: its file, tile count and bad tiles (if any, accepted).

    ``bad``: level-0 ``(x, y)`` of the bad tiles (accepted by ``--accept-bad-tiles``).
    """

    path: Path
    n_tiles: int
    n_bad: int
    bad: np.ndarray | None = None


def plan_slide(
    ctx: RunContext, entry: SlideEntry, reader: SlideReader
) -> tuple[TilePlan, TissueMap, dict[str, Any]]:
    """The slide's tile plan, its tissue (fraction of each planned tile), the plan's attributes.

    Raises:
        SlideError: No mpp, larger than glass, too many tiles, upsampling
            needed, a missing or bad mask file.
    """
    cfg = ctx.config
    mpp = resolve_mpp(reader, cfg.mpp_override, entry.mpp, cfg.mpp_tolerance)
    plan = plan_tiles(  # the slide's size and tile count are checked before any pixel is read
        reader,
        mpp,
        ctx.target_mpp,
        ctx.tile_size,
        cfg.mpp_tolerance,
        max_tiles=cfg.max_tiles_per_slide,
        interpolation=interpolation_of(ctx.info.spec, ctx.info.model),
        overlap=cfg.overlap,
        resize=cfg.resize,
    )
    mask_path = mask_file(entry.slide_id, entry.mask, cfg.masks)

    def model_mask(r: SlideReader, m: MppInfo) -> tuple[np.ndarray, float]:
        return model_tissue_mask(r, m, ctx.tissue_client, ctx.tissue_info)

    tissue = find_tissue(reader, mpp, plan, cfg.tissue, mask_path, model_mask)
    attrs = {**plan_attrs(reader, plan), "resize_interpolation": plan.interpolation}
    attrs.update(reader=cfg.reader, resize=cfg.resize)  # the reader used: slide_backend
    if mask_path is not None:
        attrs.update(tissue="mask", mask=str(mask_path))
    return plan, tissue, attrs


def embed_slide(
    ctx: RunContext,
    entry: SlideEntry,
    bulk_rna: np.ndarray | None,
    attrs: Mapping[str, Any],
    on_started: Callable[[int], None],
    on_batch: Callable[[int], None],
    stats: BatchStats,
    before_commit: Callable[[], None] | None = None,
) -> SlideOutcome:
    """Embeds one slide and writes its file; ``before_commit`` runs right before its last rename.

    Raises:
        SlideError: Unreadable slide, no mpp, ...
        RequestFailed: The server refused a batch (4xx) or retries ran out.
        CorruptTiles: After writing, when some tiles could not be read.
    """
    cfg = ctx.config
    with SlideReader.open(entry.path, cfg.reader) as reader:
        plan, tissue, slide_attrs = plan_slide(ctx, entry, reader)
        keep = tissue.fractions >= cfg.min_tissue
        coords, fractions = plan.coords[keep], tissue.fractions[keep].astype(np.float32)
        write_qc = _qc_writer(ctx, entry, reader, plan, tissue, coords)
        transports = ctx.info.transports if bulk_rna is None else ("pixels",)
        resize = plan.resize if plan.resized else None  # the server's filter is the spec's too
        problem = jpeg_problem(reader.native, plan.read_level, resize, transports, coords)
        transport = choose_transport(cfg.transport, str(entry.path), problem, ctx.info.jpeg_decode)
    slide_attrs["transport"] = transport
    on_started(len(coords))
    with _traced(ctx, len(coords)) as trace:
        readers = _ThreadReaders(entry.path, plan, coords, cfg.batch_size, cfg.reader)
        readers.jpeg = "" if transport == "pixels" else transport
        read, send = readers.read, _sender(ctx, bulk_rna, readers)
        if trace is not None:
            read, send = trace.reading(read), trace.sending(send, cfg.batch_size)
        try:
            assembled = run_batches(
                len(coords),
                cfg.batch_size,
                read,
                send,
                read_workers=cfg.read_workers,
                concurrency=cfg.concurrency,
                queue_batches=cfg.queue_batches,
                on_batch=on_batch,
                stats=stats,
            )
        finally:
            readers.close()
        all_attrs = {**attrs, **slide_attrs}
        try:
            with trace.writing() if trace is not None else contextlib.nullcontext():
                return _write(
                    ctx, entry, coords, fractions, assembled, all_attrs, write_qc, before_commit
                )
        except CorruptTiles as exc:  # say why the first bad tile was bad (file, tile, reason)
            raise CorruptTiles(f"{exc}; first: {readers.first_error}", exc.bad) from exc


def _traced(ctx: RunContext, tiles: int) -> Any:
    """The slide's span (``--otel-endpoint``), yielding its :class:`SlideTrace`; else None."""
    if ctx.tracer is None:
        return contextlib.nullcontext()
    return ctx.tracer.slide(tiles)


def _qc_writer(
    ctx: RunContext,
    entry: SlideEntry,
    reader: SlideReader,
    plan: TilePlan,
    tissue: TissueMap,
    kept: np.ndarray,
) -> Callable[[np.ndarray | None], None]:
    """Writes the slide's QC files now; returns how to write them again with bad tiles."""
    if not ctx.config.qc:
        return lambda bad: None
    if tissue.thumb is not None:
        thumb = (tissue.thumb, tissue.thumb_mpp)
    else:
        thumb = thumbnail(reader, MppInfo(plan.level0_mpp, plan.mpp_source), THUMB_MPP)

    def write(bad: np.ndarray | None) -> None:
        try:
            write_slide_qc(ctx.config.out_dir, entry.slide_id, thumb, plan, tissue, kept, bad)
        except OSError as exc:  # QC is for people; a full disk shows up in the write below
            logger.warning("slide %s: QC files not written: %s", entry.slide_id, exc)

    write(None)
    return write


def _write(
    ctx: RunContext,
    entry: SlideEntry,
    coords: np.ndarray,
    fractions: np.ndarray,
    assembled: Assembled,
    attrs: dict[str, Any],
    write_qc: Callable[[np.ndarray | None], None],
    before_commit: Callable[[], None] | None = None,
) -> SlideOutcome:
    """Writes the readable rows; raises :class:`CorruptTiles` after writing when some were not
    (more than ``--accept-bad-tiles``). ``before_commit`` (the slide unchanged?) is called
    right before the done (or incomplete) file is renamed into place: what it raises writes
    neither."""
    ok = assembled.ok
    asked = MODE_OUTPUTS[ctx.config.mode]  # features from embedding, predictions from prediction
    features_name = "embedding" if "embedding" in asked else None
    predictions_name = "prediction" if "prediction" in asked else None
    bad = coords[~ok]
    result = SlideResult(
        features=_rows(assembled.outputs, features_name, ok),
        predictions=_rows(assembled.outputs, predictions_name, ok),
        coords=coords[ok],
        tissue_fraction=fractions[ok],
        attrs={**attrs, **_bad_attrs(bad)},
    )
    out_dir, accept = ctx.config.out_dir, ctx.config.accept_bad_tiles
    if len(bad):
        write_qc(bad)  # the QC picture shows them in red
    if len(bad) <= accept:
        path = ctx.layout.write(entry.slide_id, result, before_commit)
        ctx.layout.discard_incomplete(entry.slide_id)
        return SlideOutcome(path, int(ok.sum()), len(bad), bad)
    path = ctx.layout.write_incomplete(entry.slide_id, result, before_commit)
    where = "; ".join(f"{x},{y}" for x, y in bad[:5].tolist()) + ("; ..." if len(bad) > 5 else "")
    raise CorruptTiles(
        f"{len(bad)} of {len(coords)} tiles unreadable even on a fresh handle "
        f"(level-0 x,y: {where}); the other {int(ok.sum())} are in "
        f"{path.relative_to(out_dir)} (complete=False, not done: a re-run tries again; "
        f"--accept-bad-tiles {len(bad)} accepts it with these holes)",
        bad,
    )


def _rows(outputs: Mapping[str, np.ndarray], name: str | None, ok: np.ndarray) -> np.ndarray | None:
    if name is None:
        return None
    if name not in outputs:
        if not ok.any():  # nothing was sent: an empty slide
            return np.zeros((0, 0), np.float32)
        raise EmbedError(f"the server's answer has no {name!r} output ({sorted(outputs)})")
    # Without bad tiles (the usual case) the assembled array is written as is: no copy
    # of what can be the largest array of the run (N x 1536 float32).
    return outputs[name] if ok.all() else outputs[name][ok]


def _bad_attrs(bad: np.ndarray) -> dict[str, Any]:
    """``n_bad_tiles`` always; ``bad_coords`` (level-0 x, y) only when there are any."""
    return {"n_bad_tiles": len(bad), **({"bad_coords": bad} if len(bad) else {})}


def _sender(
    ctx: RunContext, bulk_rna: np.ndarray | None, readers: _ThreadReaders
) -> Callable[[Any, slice], dict[str, np.ndarray]]:
    mode = ctx.config.mode
    # The client checks every answer (outputs, rows, the run's package: a wrong answer is
    # retried, never written); a JPEG request is held to where its tiles were decoded too.

    def infer(
        inputs: dict[str, np.ndarray], check: AnswerCheck | None = None
    ) -> dict[str, np.ndarray]:
        with ctx.in_flight:
            return ctx.client.infer(inputs, mode=mode, check=check)

    def send(tiles: np.ndarray | JpegBatch, rows: slice) -> dict[str, np.ndarray]:
        if isinstance(tiles, JpegBatch):
            try:
                return infer(tiles.inputs(), AnswerCheck.decoded_by(readers.jpeg))
            except RequestFailed as exc:  # a tile the server cannot decode, or too large for it
                if not pixels_may_help(exc):
                    raise
            pixels, ok = readers.read_pixels(tiles.coords)
            tiles.ok[:] = ok  # the batch's row mask: bad tiles become holes, as on the pixel path
            tiles = pixels[ok]
        inputs = {"pixels": tiles}
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.broadcast_to(bulk_rna, (len(tiles), len(bulk_rna)))
        return infer(inputs) if len(tiles) else {}

    return send


class _ThreadReaders:
    """One slide handle per reader thread; bad tiles found tile by tile on fresh handles.

    The native reader's decoded slide tiles are shared by the threads (one
    :class:`TileCache` per slide, bounded in bytes).
    """

    def __init__(
        self, path: Path, plan: TilePlan, coords: np.ndarray, batch_size: int, kind: str = "auto"
    ):
        self._path, self._plan, self._coords = path, plan, coords
        self._batch_size, self._kind, self._cache = batch_size, kind, TileCache()
        self.first_error = ""
        self.jpeg = ""  # jpeg, jpeg-device: send JPEG tiles; a batch that fails is read as pixels
        self._local = threading.local()
        self._all: list[SlideReader] = []
        self._lock = threading.Lock()

    def _reader(self) -> SlideReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = SlideReader.open(self._path, self._kind, self._cache)
            self._local.reader = reader
            with self._lock:
                self._all.append(reader)
        return reader

    def read(self, index: int) -> tuple[np.ndarray | JpegBatch, np.ndarray]:
        """Batch ``index``: ``(tiles, ok)``; slide JPEG tiles when ``jpeg`` and their bytes read."""
        coords = self._coords[index * self._batch_size : (index + 1) * self._batch_size]
        if self.jpeg:
            with contextlib.suppress(SlideError):  # too large, a bad tile, cut short: as pixels
                plan = self._plan
                batch = jpeg_batch(self._reader().native, plan.read_level, plan.read_size, coords)
                return batch, batch.ok
        return self.read_pixels(coords)

    def read_pixels(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tiles at ``coords`` as pixels: ``(tiles, ok)``."""
        reader = self._reader()
        try:
            return read_tiles(reader, self._plan, coords), np.ones(len(coords), bool)
        except Exception:  # a corrupt region: find the bad tiles on fresh handles
            return self._tile_by_tile(reader, coords)

    def _tile_by_tile(
        self, reader: SlideReader, coords: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        size = self._plan.tile_size
        tiles = np.full((len(coords), size, size, 3), 255, np.uint8)
        ok = np.zeros(len(coords), bool)
        for i, xy in enumerate(coords):
            for _attempt in range(2):
                reader.reopen()
                try:
                    tiles[i] = read_tile(reader, self._plan, xy)
                    ok[i] = True
                    break
                except Exception as exc:  # recorded as a bad tile below when both tries fail
                    self.first_error = self.first_error or str(exc)
        reader.reopen()
        return tiles, ok

    def close(self) -> None:
        with self._lock:
            readers, self._all = self._all, []
        for reader in readers:
            reader.close()
