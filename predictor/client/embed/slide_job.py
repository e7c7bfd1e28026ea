"""One slide, start to finish: plan, tissue, read ahead, send, assemble, write.

:func:`embed_slide` turns a :class:`~predictor.client.embed.manifest.SlideEntry`
into ``<out>/<slide_id>.h5`` or raises: a
:class:`~predictor.client.embed.errors.SlideError` (unreadable slide, no mpp, bad
bulk RNA) or a :class:`~predictor.client.embed.dispatch.RequestFailed` (a 4xx, or
retries used up). The caller records either as ``failed`` and goes on with the
next slide.

Corrupt tile regions: each reader thread has its own slide handle. A batch
whose read fails is read again tile by tile on a fresh handle
(``reader.reopen()``: OpenSlide keeps an error sticky on its handle); a tile
that fails twice is recorded as bad and left out of the output. Its
coordinates are written to the file (``bad_coords`` attribute), and the slide
is reported ``failed`` with their count, so a damaged file is never taken for
a clean one (see :class:`CorruptTiles`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.client.embed.batches import Assembled, BatchStats, run_batches
from predictor.client.embed.config import EmbedConfig
from predictor.client.embed.dispatch import Dispatcher
from predictor.client.embed.errors import EmbedError
from predictor.client.embed.grid import TilePlan, plan_tiles, read_tile, read_tiles
from predictor.client.embed.layouts import Layout
from predictor.client.embed.manifest import SlideEntry
from predictor.client.embed.output import SlideResult, plan_attrs
from predictor.client.embed.remote import ServerInfo
from predictor.client.embed.slides import SlideReader, resolve_mpp
from predictor.client.embed.tissue import tissue_fractions
from predictor.client.embed.tissue_remote import model_tissue_fractions

# Output names per mode: (features from, predictions from).
_MODE_OUTPUTS = {
    "embedding": ("embedding", None),
    "prediction": (None, "prediction"),
    "prediction_with_embedding": ("embedding", "prediction"),
}


class CorruptTiles(EmbedError):
    """Some tiles could not be read even on a fresh handle; the rest were written."""


@dataclass(frozen=True)
class RunContext:
    """What every slide of a run shares.

    Attributes:
        config: The run's options.
        info: The embedding model as the server describes it.
        tissue_info: The tissue-segmentation model (``--tissue MODEL``), else None.
        target_mpp: Microns per pixel of the tiles.
        tile_size: Tile edge (px).
        dispatcher: Sends requests for the model.
        tissue_dispatcher: Sends requests for the tissue model (None: otsu/none).
        base_attrs: Attributes every output file carries (model, spec, version, ...).
        in_flight: Bounds requests in flight over every slide of the run
            (``--concurrency``), whatever the number of slides in progress.
        layout: Where and how slides are written (``--layout``).
    """

    config: EmbedConfig
    info: ServerInfo
    tissue_info: ServerInfo | None
    target_mpp: float
    tile_size: int
    dispatcher: Dispatcher
    tissue_dispatcher: Dispatcher | None
    base_attrs: Mapping[str, Any]
    in_flight: threading.Semaphore
    layout: Layout


@dataclass(frozen=True)
class SlideOutcome:
    """A written slide: its file, tile count and bad tiles (if any)."""

    path: Path
    n_tiles: int
    n_bad: int


def plan_slide(
    ctx: RunContext, entry: SlideEntry, reader: SlideReader
) -> tuple[TilePlan, np.ndarray, dict[str, Any]]:
    """The slide's tile plan, the tissue fraction of each planned tile, the plan's attributes."""
    cfg = ctx.config
    mpp = resolve_mpp(reader, cfg.mpp_override, entry.mpp, cfg.mpp_tolerance)
    plan = plan_tiles(reader, mpp, ctx.target_mpp, ctx.tile_size, cfg.mpp_tolerance)
    if ctx.tissue_info is not None and ctx.tissue_dispatcher is not None:
        fractions = model_tissue_fractions(
            reader, mpp, plan, ctx.tissue_dispatcher, ctx.tissue_info
        )
    else:
        fractions = tissue_fractions(reader, plan, cfg.tissue)
    return plan, fractions, plan_attrs(reader, plan)


def embed_slide(
    ctx: RunContext,
    entry: SlideEntry,
    bulk_rna: np.ndarray | None,
    attrs: Mapping[str, Any],
    on_started: Callable[[int], None],
    on_batch: Callable[[int], None],
    stats: BatchStats,
) -> SlideOutcome:
    """Embeds one slide and writes its file.

    Raises:
        SlideError: Unreadable slide, no mpp, ...
        RequestFailed: The server refused a batch (4xx) or retries ran out.
        CorruptTiles: After writing, when some tiles could not be read.
    """
    cfg = ctx.config
    with SlideReader.open(entry.path) as reader:
        plan, fractions, slide_attrs = plan_slide(ctx, entry, reader)
    keep = fractions >= cfg.min_tissue
    coords, fractions = plan.coords[keep], fractions[keep].astype(np.float32)
    on_started(len(coords))
    readers = _ThreadReaders(entry.path, plan, coords, cfg.batch_size)
    try:
        assembled = run_batches(
            len(coords),
            cfg.batch_size,
            readers.read,
            _sender(ctx, bulk_rna),
            read_workers=cfg.read_workers,
            concurrency=cfg.concurrency,
            queue_batches=cfg.queue_batches,
            on_batch=on_batch,
            stats=stats,
        )
    finally:
        readers.close()
    return _write(ctx, entry, coords, fractions, assembled, {**attrs, **slide_attrs})


def _write(
    ctx: RunContext,
    entry: SlideEntry,
    coords: np.ndarray,
    fractions: np.ndarray,
    assembled: Assembled,
    attrs: dict[str, Any],
) -> SlideOutcome:
    """Writes the readable rows; raises :class:`CorruptTiles` after writing when some were not."""
    ok = assembled.ok
    features_name, predictions_name = _MODE_OUTPUTS[ctx.config.mode]
    bad = coords[~ok]
    result = SlideResult(
        features=_rows(assembled.outputs, features_name, ok),
        predictions=_rows(assembled.outputs, predictions_name, ok),
        coords=coords[ok],
        tissue_fraction=fractions[ok],
        attrs={**attrs, **_bad_attrs(bad)},
    )
    path = ctx.layout.write(entry.slide_id, result)
    if len(bad):
        raise CorruptTiles(
            f"{len(bad)} of {len(coords)} tiles unreadable even on a fresh handle, left out "
            f"(first at level-0 x,y = {bad[0].tolist()}); the other {int(ok.sum())} are in {path.name}"
        )
    return SlideOutcome(path, int(ok.sum()), 0)


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
    ctx: RunContext, bulk_rna: np.ndarray | None
) -> Callable[[np.ndarray, slice], dict[str, np.ndarray]]:
    model, mode = ctx.info.model, ctx.config.mode

    def send(tiles: np.ndarray, rows: slice) -> dict[str, np.ndarray]:
        inputs = {"pixels": tiles}
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.broadcast_to(bulk_rna, (len(tiles), len(bulk_rna)))
        with ctx.in_flight:
            return ctx.dispatcher.infer(model, inputs, {"mode": mode})

    return send


class _ThreadReaders:
    """One slide handle per reader thread; bad tiles found tile by tile on fresh handles."""

    def __init__(self, path: Path, plan: TilePlan, coords: np.ndarray, batch_size: int):
        self._path, self._plan, self._coords = path, plan, coords
        self._batch_size = batch_size
        self._local = threading.local()
        self._all: list[SlideReader] = []
        self._lock = threading.Lock()

    def _reader(self) -> SlideReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = SlideReader.open(self._path)
            with self._lock:
                self._all.append(reader)
        return reader

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``index``: ``(tiles, ok)``."""
        coords = self._coords[index * self._batch_size : (index + 1) * self._batch_size]
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
                except Exception:  # recorded as a bad tile below when both tries fail
                    continue
        reader.reopen()
        return tiles, ok

    def close(self) -> None:
        with self._lock:
            readers, self._all = self._all, []
        for reader in readers:
            reader.close()
