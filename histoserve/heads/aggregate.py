"""``histoserve aggregate``: a slide head over every feature file of a folder, resumable and sharded.

:func:`aggregate` is the Python API, what the CLI calls and what ``histoserve
embed --slide-model`` calls once its tiles are done. In order:

1. the feature files (:func:`~histoserve.results.sources.find_sources`,
   any layout; ``slide_ids`` restricts them), this process's shard of them
   (sorted by slide id, every N-th from the I-th: as ``embed`` shards);
2. the head from the server (:func:`~histoserve.heads.head.head_info`);
3. per slide: skipped when its result is complete with the same model,
   package and mode and was made from the features file as it is now
   (unless ``force``), and its pictures are of that result (else they are
   redrawn from it, or removed without ``qc``:
   :func:`~histoserve.heads.slide_head.settle_pictures`); otherwise claimed
   (``.claims/<id>.<model>.head.lock``: two processes never run one slide),
   run (:func:`~histoserve.heads.slide_head.run_slide_head`) and one line
   in ``slides_status.csv`` (``done``, ``skipped``, ``failed`` with the reason,
   formula-safe as ``status.csv``; a slide without pictures says why);
4. ``slides.csv`` rebuilt from every result of the folder, every TRIDENT
   coords folder of the job folder included (:mod:`~histoserve.heads.table`).

A slide that fails (a bad file, another width, a 4xx, retries used up, any
surprise) fails alone with the file and the reason; the others go on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from histoserve.errors import HistoserveError, UsageError
from histoserve.heads.head import head_info
from histoserve.heads.result_file import done_result, head_hash
from histoserve.heads.slide_head import (
    HeadContext,
    pictures_behind,
    remove_stale_temps,
    run_slide_head,
    settle_pictures,
)
from histoserve.heads.table import write_table
from histoserve.limits import (
    BULK_PRIORITY,
    MAX_ATTEMPTS,
    MAX_PRIORITY,
    MAX_SECONDS,
    MAX_SLIDES_IN_FLIGHT,
)
from histoserve.remote.auth import Credentials, load_credentials
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import RetryPolicy
from histoserve.remote.transport import RecyclePolicy
from histoserve.results.claims import ClaimStore
from histoserve.results.sources import FeatureSource, every_tiling, find_sources
from histoserve.results.status import StatusLog

SLIDES_STATUS_FILE = "slides_status.csv"
ALREADY_DONE = "already done with this model and these features"
logger = logging.getLogger("histoserve.aggregate")


@dataclass(frozen=True)
class AggregateConfig:
    """One ``histoserve aggregate`` run.

    Attributes:
        features_dir: The folder of feature files (``--layout``); results go beside them.
        out_dir: Where ``qc/``, ``slides.csv``, ``slides_status.csv`` and the claims
            go (None: ``features_dir``).
        urls: Where the slide model is served (one HTTP(S) URL at least).
        model: The slide model's name.
        layout: ``auto``, ``flat``, ``trident`` or ``clam``.
        encoder: TRIDENT's encoder name of the features to take (None: the only one).
        overlap: TRIDENT's overlap of the features to take (None: the only one).
        shard: ``(index, count)`` or None.
        slide_ids: Only these slides (None: every one).
        force: Run slides whose result is already complete.
        send_coords: Send ``coords`` beside the features.
        qc: Write heatmaps and QuPath GeoJSON.
        slides_dir: Where to find the slides under the pictures (``--slides``; None:
            each features file's recorded path), checked against the recorded identity.
        slides_in_flight: Slides in progress at once.
        timeout_s: Per-request timeout.
        max_attempts: Attempts per request.
        priority: Every request's class of service (``--priority``; 0: the server's default).
        credentials: CA bundle, token, headers (None: ``$HISTOSERVE_TOKEN``).
    """

    features_dir: Path
    urls: tuple[str, ...]
    model: str
    out_dir: Path | None = None
    layout: str = "auto"
    encoder: str | None = None
    overlap: int | None = None
    shard: tuple[int, int] | None = None
    slide_ids: frozenset[str] | None = None
    force: bool = False
    send_coords: bool = True
    qc: bool = True
    slides_dir: Path | None = None
    slides_in_flight: int = 2
    timeout_s: float = 300.0
    max_attempts: int = 8
    priority: int = BULK_PRIORITY
    credentials: Credentials | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise UsageError("aggregate needs --url: where the slide model is served")
        if not self.model:
            raise UsageError("aggregate needs --model: the slide model's name")
        for flag, value, least, most in (
            ("--slides-in-flight", self.slides_in_flight, 1, MAX_SLIDES_IN_FLIGHT),
            ("--max-attempts", self.max_attempts, 1, MAX_ATTEMPTS),
            ("--timeout-s", self.timeout_s, 1e-3, MAX_SECONDS),
            ("--priority", self.priority, 0, MAX_PRIORITY),
        ):
            if not least <= value <= most:  # NaN and infinity fail too
                raise UsageError(f"{flag} must be in {least:g}..{most:,}, got {value!r}")
        object.__setattr__(self, "features_dir", Path(self.features_dir))
        object.__setattr__(self, "out_dir", Path(self.out_dir or self.features_dir))
        if self.slides_dir is not None:
            object.__setattr__(self, "slides_dir", Path(self.slides_dir).absolute())
            if not self.slides_dir.is_dir():
                raise UsageError(f"--slides {self.slides_dir}: no such folder of slides")


@dataclass
class AggregateSummary:
    """What a run did, slide ids by outcome (``failed``: id -> reason)."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def select(sources: Sequence[FeatureSource], config: AggregateConfig) -> list[FeatureSource]:
    """This process's slides: the ones asked for, then the shard."""
    chosen = [s for s in sources if config.slide_ids is None or s.slide_id in config.slide_ids]
    if config.shard is None:
        return chosen
    index, count = config.shard
    return chosen[index::count]


def aggregate(
    config: AggregateConfig, on_slide: Callable[[str, str, str], None] | None = None
) -> AggregateSummary:
    """Runs the head over the folder's slides (see the module docstring).

    ``on_slide(slide_id, status, reason)`` is told each slide's outcome.

    Raises:
        UsageError: No feature files, an unknown model, not a slide model, ...
        RemoteError: The server cannot be reached or described.
    """
    start = time.monotonic()
    if config.credentials is None:
        creds = load_credentials(None, None, (), os.environ)
        config = dataclasses.replace(config, credentials=creds)
    sources = find_sources(config.features_dir, config.layout, config.encoder, config.overlap)
    mine = select(sources, config)
    if not mine and config.slide_ids is None:
        raise UsageError(f"{config.features_dir}: no feature files (*.h5) for this shard")
    retry = RetryPolicy(max_attempts=config.max_attempts)
    creds = config.credentials or Credentials()
    recycle = RecyclePolicy()
    summary = AggregateSummary()
    client = HistoserveClient(
        config.urls, config.model, config.timeout_s, credentials=creds, retry=retry, recycle=recycle,
        priority=config.priority,
    )  # fmt: skip
    with client:
        info = head_info(client)  # described once, by every URL
        ctx = HeadContext(
            info, client, config.out_dir, head_hash(info, config.send_coords),
            config.send_coords, config.qc, config.slides_dir,
        )  # fmt: skip
        runner = _Runner(ctx, config, summary, on_slide)
        with ThreadPoolExecutor(config.slides_in_flight, thread_name_prefix="head") as pool:
            list(pool.map(runner.run, mine))
    try:
        write_table(config.out_dir, every_tiling(s.root for s in sources))
    except OSError as exc:
        logger.warning("slides.csv not written: %s", exc)
    summary.seconds = time.monotonic() - start
    return summary


class _Runner:
    """Resume check, claim, head and status line for one slide at a time."""

    def __init__(
        self,
        ctx: HeadContext,
        config: AggregateConfig,
        summary: AggregateSummary,
        on_slide: Callable[[str, str, str], None] | None,
    ):
        self.ctx, self.config, self.summary, self.on_slide = ctx, config, summary, on_slide
        self.claims = ClaimStore(config.out_dir)
        self.status = StatusLog(config.out_dir, SLIDES_STATUS_FILE)
        self._lock = threading.Lock()

    def run(self, source: FeatureSource) -> None:
        """One slide; whatever goes wrong fails it alone."""
        start = time.monotonic()
        try:
            status, reason = self._run(source)
        except HistoserveError as exc:
            status, reason = "failed", str(exc)
        except Exception as exc:  # one slide's surprise never stops the others
            logger.exception("slide %s failed unexpectedly", source.slide_id)
            status, reason = (
                "failed",
                f"{source.path}: unexpected error ({type(exc).__name__}: {exc})",
            )
        self._record(source, status, reason, time.monotonic() - start)

    def _run(self, source: FeatureSource) -> tuple[str, str]:
        if (done := self._done(source, claimed=False)) is not None:
            return done
        claim = self.claims.try_claim(f"{source.slide_id}.{self.ctx.info.model}.head")
        if claim is None:
            return "skipped", "being aggregated by another process"
        with claim:
            remove_stale_temps(self.ctx, source)  # of a run killed while writing them
            if (done := self._done(source, claimed=True)) is not None:
                return done
            return "done", run_slide_head(self.ctx, source)

    def _done(self, source: FeatureSource, claimed: bool) -> tuple[str, str] | None:
        """``skipped`` and why when the result is done (its pictures settled once claimed)."""
        if self.config.force:
            return None
        attrs = done_result(source, self.ctx.info.model, self.ctx.config_hash)
        if attrs is None:
            return None
        if not pictures_behind(self.ctx, source, attrs):
            return "skipped", ALREADY_DONE
        if not claimed:
            return None  # the pictures are redrawn under the slide's claim
        return "skipped", f"{ALREADY_DONE}; {settle_pictures(self.ctx, source)}"

    def _record(self, source: FeatureSource, status: str, reason: str, seconds: float) -> None:
        reason = " ".join(reason.split())
        try:
            self.status.append(source.slide_id, str(source.path), status, 0, seconds, reason)
        except (OSError, HistoserveError) as exc:
            logger.warning("slide %s: its status line not written: %s", source.slide_id, exc)
        with self._lock:
            if status == "done":
                self.summary.done.append(source.slide_id)
            elif status == "skipped":
                self.summary.skipped.append(source.slide_id)
            else:
                self.summary.failed[source.slide_id] = reason
        if self.on_slide is not None:
            self.on_slide(source.slide_id, status, reason)
