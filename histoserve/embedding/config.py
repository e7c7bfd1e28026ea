"""Every option of ``histoserve embed`` in one frozen, validated dataclass.

The CLI builds an :class:`EmbedConfig` from its flags and the Python API takes
one directly, so both check the same things in one place: a bad value raises
:class:`~histoserve.errors.UsageError` (exit status 2) naming the option
and the value. Defaults that depend on other options (``concurrency`` and the
read-ahead depth follow the number of URLs and reader threads) are filled in
here too, so the pipeline never sees ``None`` for them.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from histoserve.errors import UsageError
from histoserve.limits import BULK_PRIORITY, DEFAULT_MAX_TILES_PER_SLIDE
from histoserve.options.checks import check_numbers, check_sources
from histoserve.options.declare import GROUPS, declared, option
from histoserve.options.service import PRIORITY_HELP
from histoserve.remote.auth import Credentials
from histoserve.slides.readers import READERS
from histoserve.slides.resample import RESIZES
from histoserve.slides.tiff.wire_tiles import TRANSPORTS
from histoserve.wire import MODES

LAYOUTS = ("flat", "trident", "clam")
PROGRESS = ("auto", "bar", "plain", "none")
# Requests in flight per URL by default: one being computed, one queued behind
# it and one on the wire keep a server's batcher fed without deep queues.
DEFAULT_CONCURRENCY_PER_URL = 4


def default_read_workers() -> int:
    """Read threads by default: the CPUs this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cpus or 1))


_IO, _SERVERS, _TILES, _REQUESTS = GROUPS


@dataclass(frozen=True)
class EmbedConfig:
    """One ``histoserve embed`` run.

    Every field but ``credentials`` is an option, declared once with
    :func:`~histoserve.options.declare.option`: its flag, the keyword of
    :func:`histoserve.embed`, its kind, default and help. ``credentials`` is
    made from :class:`CredentialOptions`: CA bundle, bearer token and extra
    headers for protected endpoints (None: ``$HISTOSERVE_TOKEN`` if set);
    never in ``repr``. ``concurrency``, ``read_workers`` and
    ``queue_batches`` at 0 are filled in from the URLs and the CPUs. ``force``
    into an ``out_dir`` made with other settings records this run's (without
    it: UsageError, :mod:`histoserve.results.run_record`). ``overlap`` is
    checked against the tile size once it is known.
    """

    urls: tuple[str, ...] = option(
        help="server, http(s)://host:port or grpc(s)://host:port; repeat for several; "
        "requests go to the one with the fewest in flight",
        kind="several",
        group=_SERVERS,
        keyword="url",
        metavar="URL",
    )
    out_dir: Path = option(
        help="output folder (<slide_id>.h5, status.csv)", kind="path", group=_IO, keyword="out"
    )
    _: KW_ONLY
    slides: tuple[Path, ...] = option(
        (),
        help="slide files (the slide id is the file stem) (default: none, the --manifest's)",
        kind="paths",
        group=_IO,
    )
    manifest: Path | None = option(
        None, help="CSV with slide_id,path[,mpp][,bulk_rna][,mask]", kind="path", group=_IO
    )
    layout: str = option(
        "flat",
        help="output files: flat (<id>.h5), trident (TRIDENT's job folder), clam (h5_files, "
        "pt_files); also how slide ids come from paths",
        kind="text",
        group=_IO,
        choices=LAYOUTS,
    )
    force: bool = option(
        False,
        help="re-embed slides that are already done; into an --out made with other settings, "
        "record this run's",
        kind="flag",
        group=_IO,
    )
    shard: tuple[int, int] | None = option(
        None,
        help="I/N: every N-th slide from the I-th; N alone: I from $JOB_COMPLETION_INDEX or "
        "$SLURM_ARRAY_TASK_ID; auto: I and N from a Slurm array",
        kind="shard",
        group=_IO,
    )
    progress: str = option(
        "auto",
        help="auto: a bar on a terminal, plain lines otherwise",
        kind="text",
        group=_IO,
        choices=PROGRESS,
    )
    qc: bool = option(
        True,
        help="no qc/ pictures and no report.html (default: both written)",
        kind="flag",
        group=_IO,
        flag="--no-qc",
    )
    model: str | None = option(
        None,
        help="model name (default: the one model the server serves besides --tissue, --slide-model)",
        kind="text",
        group=_SERVERS,
    )
    mode: str = option(
        "embedding", help="what the model returns", kind="text", group=_SERVERS, choices=MODES
    )
    slide_model: str | None = option(
        None,
        help="a served slide model run over each slide's features when done",
        kind="text",
        group=_SERVERS,
    )
    slide_urls: tuple[str, ...] = option(
        (),
        help="where --slide-model is served (default: the --url servers)",
        kind="several",
        group=_SERVERS,
        keyword="slide_url",
        metavar="URL",
    )
    target_mpp: float | None = option(
        None, help="tile mpp (default: the model's)", kind="number", group=_TILES
    )
    tile_size: int | None = option(
        None, help="tile edge in px (default: the model's)", kind="whole number", group=_TILES
    )
    mpp_override: float | None = option(
        None,
        help="level-0 mpp for every slide, ahead of the manifest and metadata",
        kind="number",
        group=_TILES,
    )
    mpp_tolerance: float = option(
        0.05, help="relative tolerance for equal mpp (levels, x vs y)", kind="number", group=_TILES
    )
    tissue: str = option(
        "otsu", help="otsu, none, or a served tissue-seg model name", kind="text", group=_TILES
    )
    tissue_urls: tuple[str, ...] = option(
        (),
        help="where the --tissue model is served (default: the --url servers)",
        kind="several",
        group=_TILES,
        keyword="tissue_url",
        metavar="URL",
    )
    min_tissue: float = option(
        0.25, help="least tissue fraction of a kept tile", kind="number", group=_TILES
    )
    masks: Path | None = option(
        None,
        help="per-slide masks <slide_id>.geojson (QuPath, level-0 px) or .png, instead of "
        "--tissue (a manifest's mask column comes first)",
        kind="path",
        group=_TILES,
        metavar="DIR",
    )
    accept_bad_tiles: int = option(
        0,
        help="a slide with at most N unreadable tiles is done (with holes) instead of failed",
        kind="whole number",
        group=_TILES,
        metavar="N",
    )
    overlap: int = option(
        0, help="pixels neighbouring tiles share", kind="whole number", group=_TILES, metavar="PX"
    )
    reader: str = option(
        "auto",
        help="native: JPEG-tiled TIFF/SVS read directly (OpenSlide's pixels); auto: where it "
        "applies",
        kind="text",
        group=_TILES,
        choices=READERS,
    )
    resize: str = option(
        "bicubic",
        help="read squares to tiles: the spec's filter, area averaging, or a reduced JPEG decode",
        kind="text",
        group=_TILES,
        choices=RESIZES,
    )
    transport: str = option(
        "auto",
        help="jpeg: the slide's own JPEG tiles to a server that decodes them on the CPU (the "
        "pixel path's features); jpeg-device: to one that decodes them on the GPU (features "
        "differ slightly); auto: jpeg where it applies",
        kind="text",
        group=_TILES,
        choices=TRANSPORTS,
    )
    max_tiles_per_slide: int = option(
        DEFAULT_MAX_TILES_PER_SLIDE,
        help="a slide whose grid plans more tiles fails before any is read",
        kind="whole number",
        group=_TILES,
        metavar="N",
    )
    batch_size: int = option(64, help="tiles per request", kind="whole number", group=_REQUESTS)
    concurrency: int = option(
        0,
        help="requests in flight over all URLs (0: 4 per URL)",
        kind="whole number",
        group=_REQUESTS,
    )
    read_workers: int = option(
        0,
        help="tile reading threads (0: the CPUs, at most 8)",
        kind="whole number",
        group=_REQUESTS,
    )
    queue_batches: int = option(
        0,
        help="batches read ahead and waiting (0: at least 2, one per reader thread)",
        kind="whole number",
        group=_REQUESTS,
        hidden=True,
    )
    slides_in_flight: int = option(
        2, help="slides in progress at once", kind="whole number", group=_REQUESTS
    )
    max_attempts: int = option(
        8, help="attempts per request (503, 429, resets)", kind="whole number", group=_REQUESTS
    )
    timeout_s: float = option(300.0, help="per-request timeout", kind="number", group=_REQUESTS)
    priority: int = option(BULK_PRIORITY, help=PRIORITY_HELP, kind="whole number", group=_REQUESTS)
    recycle_requests: int = option(
        1000,
        help="new connections after N requests (replicas an autoscaler adds get traffic)",
        kind="whole number",
        group=_REQUESTS,
    )
    recycle_s: float = option(
        30.0, help="...or after this many seconds", kind="number", group=_REQUESTS
    )
    otel_endpoint: str | None = option(
        None,
        help="trace each slide (read, wait, send, write) to this OpenTelemetry collector "
        "(OTLP/HTTP, /v1/traces appended; OTEL_* variables honoured), each request carrying "
        "its traceparent so the server's spans are under it (needs histoserve[otel])",
        kind="text",
        group=_REQUESTS,
    )
    credentials: Credentials | None = field(default=None, repr=False)

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
        check_sources(self)
        check_numbers(self)
        if self.concurrency == 0:
            set_(self, "concurrency", DEFAULT_CONCURRENCY_PER_URL * len(self.urls))
        if self.read_workers == 0:
            set_(self, "read_workers", default_read_workers())
        if self.queue_batches == 0:
            # Read-ahead only absorbs jitter: when the server is the slower side the
            # queue stays full whatever its depth, and when reading is, it stays empty.
            set_(self, "queue_batches", max(2, self.read_workers))

    @property
    def tissue_method(self) -> str:
        """``otsu``, ``none`` or ``model`` (``tissue`` then names the served model)."""
        return self.tissue if self.tissue in ("otsu", "none") else "model"


@dataclass(frozen=True, kw_only=True)
class CredentialOptions:
    """The options that make :attr:`EmbedConfig.credentials`.

    Given to :func:`histoserve.remote.auth.load_credentials` with the
    environment (``$HISTOSERVE_TOKEN``); declared like the config's own.
    """

    ca_cert: Path | None = option(
        None, help="CA bundle (PEM) for https:// and grpcs:// servers", kind="path", group=_SERVERS
    )
    token_file: Path | None = option(
        None, help="bearer token file (default: $HISTOSERVE_TOKEN)", kind="path", group=_SERVERS
    )
    trust_env: bool = option(
        False,
        help="use the environment's proxy variables (HTTP_PROXY, ...); ignored by default, so "
        "no proxy sees the token or the tiles",
        kind="flag",
        group=_SERVERS,
    )
    header: tuple[str, ...] = option(
        (),
        help="extra header (gRPC metadata on gRPC) on every request; repeat for several",
        kind="several",
        group=_SERVERS,
        metavar="'NAME: VALUE'",
    )


# Every option of `histoserve embed` and `histoserve.embed`, in declaration order.
EMBED_OPTIONS = declared(EmbedConfig, CredentialOptions)
