"""Every option of ``histoserve embed`` in one frozen, validated dataclass.

The CLI builds an :class:`EmbedConfig` from its flags and the Python API takes
one directly, so both check the same things in one place: a bad value raises
:class:`~histoserve.errors.UsageError` (exit status 2) naming the option
and the value. Defaults that depend on other options (``concurrency`` and the
read-ahead depth follow the number of URLs and read workers) are filled in
here too, so the pipeline never sees ``None`` for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from histoserve.errors import UsageError
from histoserve.limits import (
    DEFAULT_MAX_TILES_PER_SLIDE,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_COUNT,
    MAX_READ_PX,
    MAX_SECONDS,
    MAX_SLIDES_IN_FLIGHT,
    MAX_THREADS,
    mpp_problem,
)
from histoserve.remote.auth import Credentials, check_url, redact_url
from histoserve.slides.readers import READERS
from histoserve.slides.resample import RESIZES
from histoserve.slides.tiff.wire_tiles import TRANSPORTS
from histoserve.wire import MODES

LAYOUTS = ("flat", "trident", "clam")
PROGRESS = ("auto", "bar", "plain", "none")
URL_SCHEMES = ("http://", "https://", "grpc://", "grpcs://")
# Requests in flight per URL by default: one being computed, one queued behind
# it and one on the wire keep a server's batcher fed without deep queues.
DEFAULT_CONCURRENCY_PER_URL = 4


def default_read_workers() -> int:
    """Read threads by default: the CPUs this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cpus or 1))


@dataclass(frozen=True)
class EmbedConfig:
    """One ``histoserve embed`` run.

    Attributes:
        urls: Server URLs, ``http(s)://host:port`` (V2 REST, binary tensors) or
            ``grpc(s)://host:port`` (V2 gRPC, TLS with ``grpcs``). Requests go to the one
            with the fewest in flight.
        out_dir: Output folder: ``<slide_id>.h5`` per slide (see ``layout``) and ``status.csv``.
        slides: Slide paths (the slide id is the file stem).
        manifest: CSV ``slide_id,path[,mpp][,bulk_rna][,mask]`` instead of (or beside) ``slides``.
        model: Model name on the servers; ``None``: the only model they serve.
        mode: ``embedding``, ``prediction`` or ``prediction_with_embedding``.
        target_mpp: Microns per pixel of the tiles; ``None``: the model's spec.
        tile_size: Tile edge in pixels; ``None``: the model's spec.
        mpp_override: Level-0 mpp for every slide, ahead of the manifest and metadata.
        mpp_tolerance: Relative tolerance for "same mpp" (levels, x vs y).
        tissue: ``otsu``, ``none`` or the name of a served tissue-segmentation model.
        tissue_urls: Where that model is served (default: ``urls``; histoserve
            serves one model per server, so usually another URL).
        min_tissue: Tiles with a smaller tissue fraction are left out.
        batch_size: Tiles per request.
        concurrency: Requests in flight over all URLs (default 4 per URL).
        read_workers: Threads reading tiles ahead of the requests.
        queue_batches: Batches read ahead and waiting (back pressure; bounded memory).
        slides_in_flight: Slides in progress at once (the next is planned and read
            while the previous one's last requests are answered).
        force: Re-embed slides whose output is already complete; an ``out_dir``
            made with other settings then records this run's (without it:
            UsageError, :mod:`histoserve.results.run_record`).
        shard: ``(index, count)``: this process takes every count-th slide from index.
        progress: ``auto`` (bar on a terminal, plain lines otherwise), ``bar``, ``plain``, ``none``.
        max_attempts: Attempts per request (503, 429, connection errors are retried).
        timeout_s: Per-request timeout.
        recycle_requests: Keep-alive connections are replaced after this many requests...
        recycle_s: ...or this many seconds, so replicas added by an autoscaler get traffic.
        layout: Output layout, ``flat``, ``trident`` or ``clam`` (see
            :mod:`histoserve.results.layouts`); also how slide ids come from paths.
        credentials: CA bundle, bearer token and extra headers for protected
            endpoints (None: ``$HISTOSERVE_TOKEN`` if set); never in ``repr``.
        masks: Folder of per-slide masks (``<slide_id>.geojson``/``.png``/...), used
            instead of ``tissue`` (the manifest's ``mask`` column comes first).
        accept_bad_tiles: A slide with at most this many unreadable tiles is done
            (with holes); more, and it is written to ``incomplete/`` and fails.
        max_tiles_per_slide: A slide whose grid plans more tiles fails before any is read.
        qc: Write ``qc/<id>.jpg|.geojson|.json`` per slide and ``report.html``.
        slide_model: A served slide model run over each slide's features once its
            tiles are done (:mod:`histoserve.heads`); None: none.
        slide_urls: Where ``slide_model`` is served (default: the ``--url`` servers).
        overlap: Pixels (at the tile mpp) neighbouring tiles share (TRIDENT's
            ``--overlap``; less than the tile size, checked once it is known).
        reader: ``auto`` (the native JPEG-TIFF reader where it applies, else
            OpenSlide), ``openslide`` or ``native`` (:mod:`histoserve.slides.readers`).
        resize: How larger read squares become tiles: ``bicubic``, ``area`` or
            ``reduced`` (:mod:`histoserve.slides.resample`).
        transport: How tiles cross to the server: ``auto`` (the slide's own JPEG
            tiles where the server and the slide allow it, else pixels),
            ``pixels`` or ``jpeg`` (:mod:`histoserve.slides.tiff.wire_tiles`).
    """

    urls: tuple[str, ...]
    out_dir: Path
    slides: tuple[Path, ...] = ()
    manifest: Path | None = None
    model: str | None = None
    mode: str = "embedding"
    target_mpp: float | None = None
    tile_size: int | None = None
    mpp_override: float | None = None
    mpp_tolerance: float = 0.05
    tissue: str = "otsu"
    tissue_urls: tuple[str, ...] = ()
    min_tissue: float = 0.25
    batch_size: int = 64
    concurrency: int = 0
    read_workers: int = 0
    queue_batches: int = 0
    slides_in_flight: int = 2
    force: bool = False
    shard: tuple[int, int] | None = None
    progress: str = "auto"
    max_attempts: int = 8
    timeout_s: float = 300.0
    recycle_requests: int = 1000
    recycle_s: float = 30.0
    layout: str = "flat"
    credentials: Credentials | None = field(default=None, repr=False)
    masks: Path | None = None
    accept_bad_tiles: int = 0
    qc: bool = True
    max_tiles_per_slide: int = DEFAULT_MAX_TILES_PER_SLIDE
    slide_model: str | None = None
    slide_urls: tuple[str, ...] = ()
    overlap: int = 0
    reader: str = "auto"
    resize: str = "bicubic"
    transport: str = "auto"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "urls", tuple(self.urls))
        set_(self, "tissue_urls", tuple(self.tissue_urls))
        set_(self, "slide_urls", tuple(self.slide_urls))
        set_(self, "slides", tuple(Path(p) for p in self.slides))
        set_(self, "out_dir", Path(self.out_dir))
        if self.manifest is not None:
            set_(self, "manifest", Path(self.manifest))
        if self.masks is not None:
            set_(self, "masks", Path(self.masks))
            if not self.masks.is_dir():
                raise UsageError(f"--masks {self.masks}: not a folder")
        self._check_sources()
        self._check_numbers()
        if self.concurrency == 0:
            set_(self, "concurrency", DEFAULT_CONCURRENCY_PER_URL * len(self.urls))
        if self.read_workers == 0:
            set_(self, "read_workers", default_read_workers())
        if self.queue_batches == 0:
            # Read-ahead only absorbs jitter: when the server is the slower side the
            # queue stays full whatever its depth, and when reading is, it stays empty.
            set_(self, "queue_batches", max(2, self.read_workers))

    def _check_sources(self) -> None:
        if not self.urls:
            raise UsageError("no server given: pass --url http://host:port (or grpc://host:port)")
        flags = [("--url", u) for u in self.urls] + [("--tissue-url", u) for u in self.tissue_urls]
        flags += [("--slide-url", u) for u in self.slide_urls]
        for flag, url in flags:
            check_url(url, flag)  # no user-info: no URL shown anywhere carries a password
            if not url.startswith(URL_SCHEMES) or not url.split("://", 1)[1].strip("/"):
                raise UsageError(
                    f"{flag} {redact_url(url)!r}: must be http://, https://, grpc:// or "
                    "grpcs://host:port"
                )
        if self.credentials is not None:
            self.credentials.check_urls(self.urls + self.tissue_urls + self.slide_urls)
        if not self.slides and self.manifest is None:
            raise UsageError("no slides given: pass slide paths or --manifest slides.csv")
        if self.mode not in MODES:
            raise UsageError(f"--mode {self.mode!r}: must be one of {', '.join(MODES)}")
        for flag, value, choices in (
            ("--reader", self.reader, READERS),
            ("--resize", self.resize, RESIZES),
            ("--transport", self.transport, TRANSPORTS),
        ):
            if value not in choices:
                raise UsageError(f"{flag} {value!r}: must be one of {', '.join(choices)}")
        if self.layout not in LAYOUTS:
            raise UsageError(f"--layout {self.layout!r}: must be one of {', '.join(LAYOUTS)}")
        if self.slide_model is not None and self.mode == "prediction":
            raise UsageError("--slide-model takes tile features: use an embedding mode")
        if self.layout != "flat" and self.mode == "prediction":
            raise UsageError(f"--layout {self.layout} writes features: use an embedding mode")
        if self.progress not in PROGRESS:
            raise UsageError(f"--progress {self.progress!r}: must be one of {', '.join(PROGRESS)}")
        if not self.tissue:
            raise UsageError("--tissue must be otsu, none or a served model name, got ''")
        if self.shard is not None:
            index, count = self.shard
            if not 0 <= index < count:
                raise UsageError(f"--shard {index}/{count}: need 0 <= I < N")

    def _check_mpps(self) -> None:
        """``--target-mpp`` and ``--mpp-override`` in the plausible range (a mm/um slip is 1e-4)."""
        for flag, value in (
            ("--target-mpp", self.target_mpp),
            ("--mpp-override", self.mpp_override),
        ):
            problem = None if value is None else mpp_problem(value)
            if problem is not None:
                raise UsageError(f"{flag} {value!r}: {problem}")

    def _check_numbers(self) -> None:
        for flag, value, most in (
            ("--timeout-s", self.timeout_s, MAX_SECONDS),
            ("--recycle-s", self.recycle_s, MAX_SECONDS),
            ("--tile-size", self.tile_size, MAX_READ_PX),
            ("--overlap", self.overlap, MAX_READ_PX),
            ("--batch-size", self.batch_size, MAX_BATCH),
            ("--max-attempts", self.max_attempts, MAX_ATTEMPTS),
            ("--concurrency", self.concurrency, MAX_THREADS),
            ("--read-workers", self.read_workers, MAX_THREADS),
            ("--queue-batches", self.queue_batches, MAX_THREADS),
            ("--slides-in-flight", self.slides_in_flight, MAX_SLIDES_IN_FLIGHT),
            ("--recycle-requests", self.recycle_requests, MAX_COUNT),
            ("--max-tiles-per-slide", self.max_tiles_per_slide, MAX_COUNT),
            ("--accept-bad-tiles", self.accept_bad_tiles, MAX_COUNT),
        ):
            if value is not None and not value <= most:  # NaN and infinity fail too
                raise UsageError(f"{flag} must be at most {most:,}, got {value!r}")
        positive = {
            "--target-mpp": self.target_mpp,
            "--mpp-override": self.mpp_override,
            "--timeout-s": self.timeout_s,
        }
        for flag, value in positive.items():
            if value is not None and not value > 0:
                raise UsageError(f"{flag} must be > 0, got {value!r}")
        self._check_mpps()
        at_least_one = {
            "--tile-size": self.tile_size,
            "--batch-size": self.batch_size,
            "--max-attempts": self.max_attempts,
            "--recycle-requests": self.recycle_requests,
            "--slides-in-flight": self.slides_in_flight,
            "--max-tiles-per-slide": self.max_tiles_per_slide,
        }
        for flag, value in at_least_one.items():
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be >= 1, got {value!r}")
        zero_or_more = {
            "--concurrency": self.concurrency,
            "--read-workers": self.read_workers,
            "--queue-batches": self.queue_batches,
        }
        for flag, value in zero_or_more.items():
            if value < 0:
                raise UsageError(f"{flag} must be >= 1 (0: the default), got {value!r}")
        if not 0.0 <= self.mpp_tolerance < 1.0:
            raise UsageError(f"--mpp-tolerance must be in [0, 1), got {self.mpp_tolerance!r}")
        if self.overlap < 0:
            raise UsageError(f"--overlap must be >= 0 px, got {self.overlap!r}")
        if self.accept_bad_tiles < 0:
            raise UsageError(f"--accept-bad-tiles must be >= 0, got {self.accept_bad_tiles!r}")
        if not 0.0 <= self.min_tissue <= 1.0:
            raise UsageError(f"--min-tissue must be in [0, 1], got {self.min_tissue!r}")
        if not self.recycle_s > 0:
            raise UsageError(f"--recycle-s must be > 0, got {self.recycle_s!r}")

    @property
    def tissue_method(self) -> str:
        """``otsu``, ``none`` or ``model`` (``tissue`` then names the served model)."""
        return self.tissue if self.tissue in ("otsu", "none") else "model"
