"""A whole ``histoserve embed`` run: which slides, resume, claims, slides overlapping.

:func:`embed` is the Python API and what the CLI calls. In order:

1. the slides (paths and/or manifest; ``UsageError`` when none), this
   process's shard of them;
2. the model from the server (``GET /v2/models/{name}/config``): tile size and
   target mpp unless given, the package identity for the config hash;
3. per slide: skipped when its files are complete with the same config hash,
   were made from this very slide (its content identity,
   :mod:`~histoserve.slides.identity`) and are whole (a two-file layout's
   pair, :meth:`~histoserve.results.layouts.Layout.check_done`), unless
   ``--force``; otherwise embedded again, the status line saying why (a
   changed slide, a torn pair, an older histoserve's file); claimed
   atomically (two processes never embed one slide; a dead holder's claim is
   taken over at once); embedded; one line in ``status.csv`` (``done``,
   ``skipped`` or ``failed`` with the reason);
   a slide with unreadable tiles is ``failed`` on every run (unless
   ``--accept-bad-tiles`` accepts that many) and never skipped.
   ``--slides-in-flight`` slides are in progress at once (default 2), sharing
   one bound of ``--concurrency`` requests in flight;
4. ``<out>/report.html`` over every slide of the folder (``--no-qc``: none);
   ``--slide-model``: its head over the done slides (:mod:`histoserve.embedding.slide_model`).

A slide that fails (missing, unreadable, no mpp, corrupt tiles, a 4xx,
retries used up, a bad claim file, changed while it was embedded: checked
right before its done file is renamed into place, so it gets none; or any
unexpected error in its resume check, claim or status line) fails alone: the
others go on. Usage errors (bad ids, two ids one file on a case-insensitive
volume, a folder inside ``--out`` the run writes in that is a symlink) stop
the run before any slide. The report never ends a run: what stops it is a
warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from histoserve import __version__
from histoserve.atomic import open_folder, sweep_dead_temps
from histoserve.embedding.batches import BatchStats
from histoserve.embedding.config import EmbedConfig
from histoserve.embedding.memory import large_buffers_use_mmap
from histoserve.embedding.progress import Progress
from histoserve.embedding.settings import (
    RUN_SETTINGS_ATTR,
    check_done_files,
    differences,
    run_settings,
    slide_settings,
)
from histoserve.embedding.slide_job import RunContext, embed_slide
from histoserve.embedding.slide_model import check_slide_model, run_slide_model
from histoserve.embedding.tracing import RunTracer
from histoserve.errors import HistoserveError, SlideError, UsageError
from histoserve.remote.auth import load_credentials, warn_if_plaintext
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import RetryPolicy
from histoserve.remote.served_model import ServerInfo
from histoserve.remote.transport import RecyclePolicy
from histoserve.results.claims import ClaimStore
from histoserve.results.layouts import DoneCheck, Layout, slide_id_from_path
from histoserve.results.output import check_holder, config_hash
from histoserve.results.run_record import FolderHold, hold_folder
from histoserve.results.status import StatusLog
from histoserve.review.qc import QC_DIR
from histoserve.review.report import REPORT_FILE, write_report
from histoserve.slides.bulk_rna import read_bulk_rna
from histoserve.slides.identity import (
    IDENTITY_ATTR,
    SlideIdentity,
    check_unchanged,
    slide_identity,
)
from histoserve.slides.manifest import (
    SlideEntry,
    check_unique,
    entries_from_paths,
    read_manifest,
    select_shard,
)

logger = logging.getLogger("histoserve.embed")


@dataclass
class EmbedSummary:
    """What a run did, slide ids by outcome (``failed``: id -> reason)."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    tiles: int = 0
    seconds: float = 0.0
    stats: BatchStats = field(default_factory=BatchStats)
    requests_per_url: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when every slide is done or skipped, 1 when some failed."""
        return 1 if self.failed else 0


def collect_entries(config: EmbedConfig) -> list[SlideEntry]:
    """This process's slides: paths, then the manifest, then the shard; UsageError when none."""

    def id_of(path: Path) -> str:
        return slide_id_from_path(path, config.layout)

    entries = entries_from_paths(config.slides, id_of) if config.slides else []
    if config.manifest is not None:
        entries += read_manifest(config.manifest)
    check_unique(entries)  # paths and manifest together: same id, or one file on macOS
    if not entries:
        raise UsageError("no slides given: pass slide paths or a --manifest with rows")
    return select_shard(entries, config.shard)


def _context(config: EmbedConfig) -> RunContext:
    """The run's shared context: the models described, one client for each (closed by the caller)."""
    retry = RetryPolicy(max_attempts=config.max_attempts)
    with contextlib.ExitStack() as opened:  # closed here only when the context is not made
        client = opened.enter_context(
            _client(config, config.urls, config.model, retry, _served_beside(config))
        )
        info = client.info  # described once, by every URL
        info.check_mode(config.mode)
        tissue_client, tissue_info = None, None
        if config.tissue_method == "model":
            urls = config.tissue_urls or config.urls
            tissue_client = opened.enter_context(_client(config, urls, config.tissue, retry))
            tissue_info = tissue_client.info
            if not tissue_info.answers_masks:
                raise UsageError(f"--tissue {config.tissue}: not a segmentation model")
            if tissue_info.mpp is None:
                raise UsageError(
                    f"--tissue {config.tissue}: its server does not say the model's mpp "
                    "(no ModelConfig over gRPC): give an http(s):// --tissue-url"
                )
        ctx = _context_of(config, client, info, tissue_client, tissue_info)
        opened.pop_all()
    return ctx


def _context_of(
    config: EmbedConfig,
    client: HistoserveClient,
    info: ServerInfo,
    tissue_client: HistoserveClient | None,
    tissue_info: ServerInfo | None,
) -> RunContext:
    target_mpp = config.target_mpp or info.mpp
    if target_mpp is None:
        raise UsageError(
            f"the server does not say model {info.model!r}'s mpp (it answers no gRPC "
            "ModelConfig, only ModelMetadata): pass --target-mpp"
        )
    tile_size = config.tile_size or info.tile_size
    attrs = {
        "model": info.model,
        "package_sha256": info.package_sha256,
        "spec": json.dumps(info.spec, sort_keys=True, default=str),
        "mode": config.mode,
        "tissue": config.tissue,
        "tissue_package_sha256": tissue_info.package_sha256 if tissue_info else None,
        "min_tissue": config.min_tissue,
        "histoserve_version": __version__,
    }
    ctx = RunContext(
        config,
        info,
        tissue_info,
        target_mpp,
        tile_size,
        client,
        tissue_client,
        attrs,
        threading.BoundedSemaphore(config.concurrency),
        _layout(config, info, target_mpp, tile_size),
        RunTracer(config.otel_endpoint) if config.otel_endpoint else None,
    )
    attrs[RUN_SETTINGS_ATTR] = run_settings(ctx)  # every done file's copy of the record
    return ctx


def _hold_folder(ctx: RunContext) -> FolderHold:
    """The run's hold on its folder with its settings (:mod:`~histoserve.results.run_record`).

    The folder is ``--out``, or for TRIDENT the coords folder of this run's
    geometry: TRIDENT keeps each geometry (magnification, size, overlap) in
    its own folder of one job folder, so only runs into the same one must agree.
    """
    out, settings = ctx.config.out_dir, ctx.base_attrs[RUN_SETTINGS_ATTR]
    folder = ctx.layout.coords_dir if ctx.layout.name == "trident" else out
    with open_folder(out, folder):  # made here, never through a symlink
        pass
    check = functools.partial(check_done_files, folder, settings)
    return hold_folder(folder, settings, differences, check, force=ctx.config.force)


def _served_beside(config: EmbedConfig) -> tuple[str, ...]:
    """The run's tissue model and slide head: never its encoder, so with no ``--model`` the
    encoder is the one model ``--url`` serves besides them (one server serving all three)."""
    tissue = (config.tissue,) if config.tissue_method == "model" else ()
    return tissue + ((config.slide_model,) if config.slide_model else ())


def _client(
    config: EmbedConfig,
    urls: Any,
    model: str | None,
    retry: RetryPolicy,
    besides: tuple[str, ...] = (),
) -> HistoserveClient:
    """The client that sends the run's requests to ``model`` (None: the one served but
    ``besides``) at ``urls``."""
    recycle = RecyclePolicy(config.recycle_requests, config.recycle_s)
    kwargs = {"credentials": config.credentials, "retry": retry, "recycle": recycle}
    return HistoserveClient(
        urls, model, config.timeout_s, priority=config.priority, besides=besides, **kwargs
    )


def _layout(config: EmbedConfig, info: ServerInfo, target_mpp: float, tile_size: int) -> Layout:
    dim = info.spec.get("embedding_dim") or 0
    for out in info.spec.get("outputs", ()) if not dim else ():  # gRPC metadata only
        if isinstance(out, dict) and out.get("name") == "embedding":
            dim = int(out["shape"][-1])
    layout, out = config.layout, config.out_dir
    return Layout(layout, out, target_mpp, tile_size, info.model, int(dim), config.overlap)


def embed(config: EmbedConfig, stream: Any = None) -> EmbedSummary:
    """Runs ``histoserve embed``; returns what happened to each slide.

    Raises:
        UsageError: Bad usage found before any slide (no slides, unknown model, ...).
        RemoteError: The server cannot be reached or described.
    """
    start = time.monotonic()
    large_buffers_use_mmap()
    if config.credentials is None:  # the Python API: $HISTOSERVE_TOKEN as the CLI reads it
        creds = load_credentials(None, None, (), os.environ)
        config = dataclasses.replace(config, credentials=creds)
    warn_if_plaintext(config.credentials, config.urls + config.tissue_urls + config.slide_urls)
    entries = collect_entries(config)
    check_slide_model(config)  # not a slide head: a usage error before any slide
    try:
        config.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {config.out_dir}: cannot create it ({exc})") from exc
    summary = EmbedSummary()
    with contextlib.ExitStack() as held:  # the folder's hold lasts to the slide model's end
        ctx = _context(config)
        if ctx.tracer is not None:
            held.callback(ctx.tracer.close)  # its spans exported before the run returns
        with ctx.client, ctx.tissue_client or contextlib.nullcontext():
            _run(ctx, entries, stream, summary, held)
        run_slide_model(config, summary)
    summary.seconds = time.monotonic() - start
    return summary


def _run(
    ctx: RunContext,
    entries: list[SlideEntry],
    stream: Any,
    summary: EmbedSummary,
    held: contextlib.ExitStack,
) -> None:
    config = ctx.config
    held.enter_context(_hold_folder(ctx))  # UsageError: the folder was made otherwise
    progress = Progress(config.progress, len(entries), stream, stats=summary.stats)
    runner = _SlideRunner(ctx, progress, summary)
    # Slides overlap (--slides-in-flight): the next one is opened, planned and read
    # while the last requests of the previous one are answered, so the server's
    # queue does not run dry at every slide boundary.
    with ThreadPoolExecutor(config.slides_in_flight, thread_name_prefix="slide") as pool:
        for _ in pool.map(runner.run, entries):
            pass
    progress.close()
    summary.requests_per_url = ctx.client.stats()
    if config.qc:
        try:
            write_report(config.out_dir)
        except Exception as exc:  # the report is for people: it never ends a run
            debug = logger.isEnabledFor(logging.DEBUG)
            logger.warning("report.html not written: %s", exc, exc_info=debug)


class _SlideRunner:
    """Resume check, claim, embed and status line for one slide at a time."""

    def __init__(self, ctx: RunContext, progress: Progress, summary: EmbedSummary):
        self.ctx, self.progress, self.summary = ctx, progress, summary
        out = ctx.config.out_dir
        ctx.layout.check_folders(*((QC_DIR,) if ctx.config.qc else ()))  # UsageError: a symlink
        sweep_dead_temps(out / QC_DIR, root=out)  # what killed runs left that no claim covers
        sweep_dead_temps(out, root=out, final=REPORT_FILE)
        self.status, self.claims = StatusLog(out), ClaimStore(out)
        self._lock = threading.Lock()

    def run(self, entry: SlideEntry) -> None:
        """Resume check, claim, embed, status line; whatever goes wrong fails this slide alone."""
        start = time.monotonic()
        try:
            self._run(entry, start)
        except HistoserveError as exc:
            self._fail(entry, start, str(exc))
        except Exception as exc:  # one slide's surprise never stops the others
            logger.exception("slide %s failed unexpectedly", entry.slide_id)
            self._fail(entry, start, _unexpected(exc))

    def _run(self, entry: SlideEntry, start: float) -> None:
        try:
            chash = config_hash(slide_settings(self.ctx, entry))
        except (OSError, ValueError) as exc:  # ValueError: a NUL in a path (the Python API)
            raise SlideError(f"bulk RNA or mask file: {exc}") from exc
        identity = slide_identity(entry.path)
        if self._check(entry, chash, identity).done:
            self._record(entry, "skipped", 0, start, "already done with this configuration")
            return
        claim = self.claims.try_claim(entry.slide_id)  # SlideError: a bad lock file
        if claim is None:
            self._record(entry, "skipped", 0, start, "being embedded by another process")
            return
        with claim:
            self.ctx.layout.remove_stale_temps(entry.slide_id)
            check = self._check(entry, chash, identity)
            if check.done:  # finished by another process meanwhile
                self._record(entry, "skipped", 0, start, "already done with this configuration")
                return
            self._embed(entry, chash, identity, check.reason, start)

    def _check(self, entry: SlideEntry, chash: str, identity: SlideIdentity) -> DoneCheck:
        cfg = self.ctx.config
        if cfg.force:
            done_file = self.ctx.layout.done_file(entry.slide_id)
            check_holder(done_file, entry.slide_id)  # --force never overwrites another id's file
            return DoneCheck(False)
        return self.ctx.layout.check_done(entry.slide_id, chash, identity, cfg.accept_bad_tiles)

    def _embed(
        self, entry: SlideEntry, chash: str, identity: SlideIdentity, why: str, start: float
    ) -> None:
        """Embeds and writes the slide; ``why``: why an earlier done file was not kept."""
        attrs = {
            **self.ctx.base_attrs,
            "slide_id": entry.slide_id,
            "slide_path": str(entry.path),
            "config_hash": chash,
            IDENTITY_ATTR: identity.to_attr(),
        }
        n_tiles = 0

        def started(n: int) -> None:
            nonlocal n_tiles
            n_tiles = n
            self.progress.slide_started(entry.slide_id, n)

        try:
            bulk = None
            if entry.bulk_rna is not None:
                bulk = read_bulk_rna(entry.bulk_rna, self.ctx.info.n_genes)
            unchanged = functools.partial(check_unchanged, entry.path, identity)
            tiles, stats = self.progress.tiles, self.summary.stats
            outcome = embed_slide(self.ctx, entry, bulk, attrs, started, tiles, stats, unchanged)
        except HistoserveError as exc:
            self._record(entry, "failed", n_tiles, start, str(exc))
            return
        except Exception as exc:  # one slide's surprise never stops the others
            logger.exception("slide %s failed unexpectedly", entry.slide_id)
            self._record(entry, "failed", n_tiles, start, _unexpected(exc))
            return
        with self._lock:
            self.summary.tiles += outcome.n_tiles
        self._record(entry, "done", outcome.n_tiles, start, _done_note(why, outcome.n_bad))

    def _fail(self, entry: SlideEntry, start: float, reason: str) -> None:
        """Records the slide failed; when even that fails, the summary still says so."""
        try:
            self._record(entry, "failed", 0, start, reason)
        except Exception:
            logger.exception("slide %s: its failure could not be recorded", entry.slide_id)
            with self._lock:
                self.summary.failed[entry.slide_id] = reason

    def _record(
        self, entry: SlideEntry, status: str, n_tiles: int, start: float, error: str = ""
    ) -> None:
        seconds = time.monotonic() - start
        error = " ".join(error.split())  # one line in status.csv
        self.status.append(entry.slide_id, str(entry.path), status, n_tiles, seconds, error)
        self.progress.slide_finished(entry.slide_id, status, n_tiles, seconds, error)
        with self._lock:
            self._add(entry.slide_id, status, error)

    def _add(self, slide_id: str, status: str, error: str) -> None:
        if status == "done":
            self.summary.done.append(slide_id)
        elif status == "skipped":
            self.summary.skipped.append(slide_id)
        else:
            self.summary.failed[slide_id] = error


def _done_note(why: str, n_bad: int) -> str:
    """A done slide's status note: why it was embedded again, accepted holes."""
    notes = [f"re-embedded: {why}"] if why else []
    if n_bad:  # accepted with --accept-bad-tiles: said on every run that writes it
        notes.append(f"{n_bad} unreadable tiles accepted (--accept-bad-tiles), see bad_coords")
    return "; ".join(notes)


def _unexpected(exc: Exception) -> str:
    return f"unexpected error ({type(exc).__name__}: {exc}); the log has the traceback"
