"""Frozen configuration passed explicitly from the CLI to each part.

Nothing here reads the environment or parses arguments: :mod:`predictor.cli`
builds these once and hands them down, so every part is testable alone. A
field made with :func:`predictor.flags.flag` is also the server's flag of the
same name: its one declaration (default, conversion, help); the parser and
the configs are made from these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from predictor.errors import ConfigError, InvalidInput
from predictor.flags import auto_or_count, flag, names_list, per_class, ratio, true_or_false


@dataclass(frozen=True)
class BatchingConfig:
    """How the in-process dynamic batcher forms batches.

    Attributes:
        max_batch_size: Most tiles per forward call.
        max_latency_ms: Longest a queued tile waits for its batch to fill
            while the device is busy; an idle device dispatches at once.
        max_queue_size: Most tiles waiting in each class of service; beyond
            it new requests of that class get 503.
        max_decode_pixels: Most pixels the requests in stage 1 decode and
            resize (:mod:`predictor.model.admission`: a jpeg request's slide
            tiles' declared pixels and its boxes' pixels); beyond it a new
            such request gets 503, unless stage 1 holds none. The default is
            three times ``--max_request_pixels``'s: one request at that
            budget (at most twice it: declared and covered) and room for
            ordinary ones (a client's 64 boxes of 448 px: 24.5 Mi).
        retry_after_s: ``Retry-After`` hint sent with overload 503s.
        priority_levels: Classes of service, 1 (most urgent) to this (a
            request's V2 ``priority``, Triton's convention): 1 interactive, 2 bulk.
        default_priority: The class of a request that names none (or 0, as
            tritonclient sends by default); 0: the least urgent class.
        max_queue_delay_ms: How long a class may go unserved while it has
            tiles waiting before its oldest goes first (the age bound that
            keeps more urgent classes from starving it): one value for
            every class but the first, or one per class (0: no bound).
        urgent_wait_ms: The device time a batch may take while a class more
            urgent than the one it serves is active (has tiles waiting, or
            a request in the last second): such batches are cut to the
            size whose forward took about this long (learnt from the
            forwards), never below the urgent class's own last batch, so an
            urgent arrival waits for at most about that on a device it
            cannot preempt. Costs throughput where a smaller batch costs
            more per tile, only while urgent traffic comes; 0: never cut.
        weight: This model's share of a device it shares with other models
            (:mod:`predictor.batching.scheduler`): under contention each
            model's device time goes as its weight; set per model in its
            folder's ``histoserve.json``.
    """

    max_batch_size: int = flag(32, "tiles per forward", type=int)
    max_latency_ms: float = flag(5.0, "longest wait to fill a batch", type=float)
    max_queue_size: int = flag(1024, "tiles waiting per class of service before 503", type=int)
    max_decode_pixels: int = flag(
        192 * 1024 * 1024,
        "jpeg_tiles: pixels the requests being decoded may declare and cover before 503",
        type=int,
    )
    retry_after_s: float = 1.0
    priority_levels: int = flag(2, "classes of service; 1 is the most urgent", type=int)
    default_priority: int = flag(
        0, "class of a request that names none; 0: the least urgent", type=int
    )
    max_queue_delay_ms: tuple[float, ...] = flag(
        (1000.0,),
        "longest a class waits unserved before it goes first: one value for every class "
        "but the first, or a comma-separated value per class (0: no bound)",
        type=per_class,
    )
    urgent_wait_ms: float = flag(
        25.0,
        "while a more urgent class is active, less urgent batches are cut to about this much "
        "device time (the wait of an urgent arrival); 0: never cut",
        type=float,
    )
    weight: float = flag(
        1.0,
        "a model's share of a device shared by several models (device time under contention)",
        type=float,
    )

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_latency_ms < 0:
            raise ConfigError(f"max_latency_ms must be >= 0, got {self.max_latency_ms}")
        if self.max_queue_size < self.max_batch_size:
            raise ConfigError(
                f"max_queue_size ({self.max_queue_size}) must be >= max_batch_size "
                f"({self.max_batch_size})"
            )
        if self.max_decode_pixels < 1:
            raise ConfigError(f"max_decode_pixels must be >= 1, got {self.max_decode_pixels}")
        if self.retry_after_s <= 0:
            raise ConfigError(f"retry_after_s must be > 0, got {self.retry_after_s}")
        if not 1 <= self.priority_levels <= 16:
            raise ConfigError(f"priority_levels must be 1..16, got {self.priority_levels}")
        if not 0 <= self.default_priority <= self.priority_levels:
            raise ConfigError(
                f"default_priority must be 0..priority_levels ({self.priority_levels}), "
                f"got {self.default_priority}"
            )
        if not 0 <= self.urgent_wait_ms <= 60_000:
            raise ConfigError(f"urgent_wait_ms must be 0..60000, got {self.urgent_wait_ms}")
        if not 0 < self.weight <= 1000:
            raise ConfigError(f"weight must be > 0 and <= 1000, got {self.weight}")
        delays = self.max_queue_delay_ms
        if len(delays) not in (1, self.priority_levels) or any(not d >= 0 for d in delays):
            raise ConfigError(
                f"max_queue_delay_ms must be one value >= 0 or {self.priority_levels} "
                f"(one per class), got {','.join(map(str, delays))}"
            )

    def priority_of(self, asked: int | None) -> int:
        """The class a request asking for ``asked`` goes in (None or 0: ``default_priority``).

        Raises:
            InvalidInput: ``asked`` is past ``priority_levels`` (a 400 naming ``priority``).
        """
        if asked is not None and asked > self.priority_levels:
            raise InvalidInput(
                f"parameter 'priority' must be 0 (the default class) or 1 (most urgent) to "
                f"{self.priority_levels}, got {str(asked)[:40]}"
            )
        return asked or self.default_priority or self.priority_levels

    def queue_delays_s(self) -> tuple[float | None, ...]:
        """Per class (index 0: priority 1), its age bound in seconds; None: no bound.

        One value given is every class's but the first (the most urgent class
        always leads, so a bound on it means nothing).
        """
        delays = self.max_queue_delay_ms
        if len(delays) == 1:
            delays = (0.0,) + delays * (self.priority_levels - 1)
        return tuple(d / 1000.0 if d > 0 else None for d in delays)


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds on client input, checked before any expensive work.

    Attributes:
        max_tiles_per_request: Most tiles one request may carry.
        max_image_bytes: Largest encoded tile accepted.
        max_image_pixels: Largest decoded image (w*h) accepted, checked from
            the header before decoding (decompression bombs).
        max_bulk_rna_length: Longest bulk RNA vector accepted.
        max_body_bytes: Largest HTTP request body accepted.
        max_tiles_per_slide: Slide models: most tiles (``N``) one slide may carry.
        max_request_pixels: The jpeg transport's budget for one request
            (:mod:`predictor.codecs.jpeg_plan`): the pixels its slide tiles'
            headers declare (what decoding them holds), the pixels its boxes
            cover and the pixels pasted into them, each at most this, checked
            before any decode on the CPU and the device alike.
    """

    max_tiles_per_request: int = flag(1024, "most tiles in one request", type=int)
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = flag(4096 * 4096, "decoded size cap (bombs)", type=int)
    max_bulk_rna_length: int = 100_000
    max_body_bytes: int = flag(256 * 1024 * 1024, "HTTP body / gRPC message cap", type=int)
    max_tiles_per_slide: int = flag(
        200_000,
        "slide models: most tiles in one slide's features (also bounded by the package)",
        type=int,
    )
    max_request_pixels: int = flag(
        64 * 1024 * 1024,
        "jpeg_tiles: pixels one request may decode (and its boxes cover, and paste)",
        type=int,
    )

    def __post_init__(self) -> None:
        for name in (
            "max_tiles_per_request",
            "max_image_bytes",
            "max_image_pixels",
            "max_bulk_rna_length",
            "max_body_bytes",
            "max_tiles_per_slide",
            "max_request_pixels",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


FORWARD_RUNNERS = ("auto", "torch", "gil_free")
"""``--forward_runner`` choices (see :class:`ModelConfig`)."""
JPEG_DECODES = ("cpu", "device")
"""``--jpeg_decode`` choices (see :class:`ModelConfig`)."""
LOAD_PROBES = ("auto", "on", "off")
"""``--load_probe`` choices (see :class:`ModelConfig`)."""


@dataclass(frozen=True)
class ModelConfig:
    """Which package to serve, where, and how.

    Attributes:
        model_dir: Directory holding checkpoints (``/opt/ml/model``).
        checkpoint: File name in ``model_dir``; ``None`` takes the ``*.pt2`` there that fits
            this host (:mod:`predictor.packages.package_set`).
        spec: Built-in spec name or spec file path overriding the embedded one.
        model_name: Name in URLs; ``None`` uses the spec's name.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        preprocess_workers: The stage-1 decode pool's threads (the flag keeps its name).
        fault_injection: Test-only forward fault hook (see :mod:`predictor.device.faults`);
            ``None`` (the default) disables it.
        forward_runner: ``auto`` (the default: ``gil_free`` on the CPU, falling
            back to ``torch`` with one log line for a package it cannot serve;
            ``torch`` on a GPU), ``torch`` (torch's AOTInductor loader) or
            ``gil_free`` (:mod:`predictor.runtime.aoti_runner`: the package's C
            ABI called with the GIL released, CPU only).
        instances_per_device: Device workers sharing the one queue (Triton's
            instance groups), per device: CPU or each GPU (own normaliser and
            CUDA stream per instance). ``None`` (the default, ``auto``): what
            measured best for the device (:func:`predictor.device.cpus.resolve_instances`).
        model_class: ``MODULE:CLASS`` of a ``BaseServerModel`` subclass to
            serve; ``None`` serves the spec family's class.
        jpeg_decode: Where the jpeg transport's slide tiles are decoded: ``cpu``
            (libjpeg-turbo in the stage-1 pool: the pixel path's features bit
            for bit), ``device`` (nvJPEG on a CUDA device, composed and
            resized there: :mod:`predictor.device.jpeg`; the CPU where it
            cannot run). ``cpu`` is the default: on an H200 nvJPEG decoded as
            many tiles as 9-12 cores (docs/performance.md, "GPU"), but in
            the device worker's turn, so a node with more cores than that
            serves more with the pool.
        allow_tf32: Lets fp32 packages run their cuBLAS/cuDNN matmuls and
            convolutions in TF32 on CUDA (Ampere and later: several times faster,
            ~1e-3 relative error); bf16/fp16 packages and the CPU are unaffected.
        load_probe: Load the package once in a child process before this one
            loads it (:mod:`predictor.runtime.load_probe`): ``on``, ``off`` or
            ``auto`` (the default: CUDA packages, and any package this host
            has not loaded before: :mod:`predictor.packages.probe_record`), so a
            package whose native code crashes, exits or hangs on load stops
            start-up with exit 2 and a message, not a silent signal.
        load_timeout_s: The probe's deadline, the child's ``import torch``
            included; past it the child's process group is killed (exit 2).
    """

    model_dir: Path = flag(Path("/opt/ml/model"), "where checkpoints live", type=Path)
    checkpoint: str | None = flag(
        None, "file name in model_dir (default: the *.pt2 there that fits this host)"
    )
    spec: str | None = flag(None, "built-in spec name or spec file; overrides the embedded one")
    model_name: str | None = flag(None, kserve=True)  # None: the spec's name
    device: str = flag("auto", "auto (every visible GPU, else cpu), cpu, cuda or cuda:N")
    # the command line's default is the CPUs this process may use (predictor.cli)
    preprocess_workers: int = flag(2, "stage-1 threads", type=int)
    fault_injection: str | None = flag(None, hidden=True)
    forward_runner: str = flag(
        "auto",
        "torch's AOTI loader, or gil_free: the package's C ABI with the GIL released "
        "(CPU only); auto: gil_free on the CPU (torch's loader where it cannot serve the "
        "package, one log line), torch on a GPU",
        choices=FORWARD_RUNNERS,
    )
    instances_per_device: int | None = flag(
        None,
        "device workers per device on one shared queue (CPU or each GPU); auto (the "
        "default): 2 on the CPU, each with half the cores' threads, 1 on a GPU",
        type=auto_or_count,
    )
    model_class: str | None = flag(
        None,
        "MODULE:CLASS of a predictor.BaseServerModel subclass to serve "
        "(default: the spec family's class)",
    )
    allow_tf32: bool = flag(
        False,
        "fp32 packages on CUDA: cuBLAS/cuDNN matmuls in TF32 (faster, ~1e-3 relative error)",
        type=true_or_false,
    )
    jpeg_decode: str = flag(
        "cpu",
        "where jpeg-transport tiles are decoded: cpu (libjpeg-turbo in the stage-1 pool, "
        "the pixel path's features bit for bit) or device (nvJPEG on a GPU, composed and "
        "resized there; the CPU where it cannot run)",
        choices=JPEG_DECODES,
    )
    load_probe: str = flag(
        "auto",
        "load the package once in a child process first, so a crash or hang on load is "
        "exit 2 with a message (not a silent signal): on, off, or auto (CUDA packages, and "
        "any package this host has not loaded before)",
        choices=LOAD_PROBES,
    )
    load_timeout_s: float = flag(
        300.0,
        "the load probe's deadline in seconds (the child's torch import included)",
        type=float,
    )

    def __post_init__(self) -> None:
        if self.load_probe not in LOAD_PROBES:
            raise ConfigError(f"load_probe must be auto, on or off, got {self.load_probe!r}")
        if self.load_timeout_s <= 0:
            raise ConfigError(f"load_timeout_s must be > 0, got {self.load_timeout_s}")
        if self.instances_per_device is not None and self.instances_per_device < 1:
            raise ConfigError(f"instances_per_device must be >= 1, got {self.instances_per_device}")
        if self.forward_runner not in FORWARD_RUNNERS:
            raise ConfigError(
                f"forward_runner must be auto, torch or gil_free, got {self.forward_runner!r}"
            )
        if self.preprocess_workers < 1:
            raise ConfigError(f"preprocess_workers must be >= 1, got {self.preprocess_workers}")
        if self.jpeg_decode not in JPEG_DECODES:
            raise ConfigError(f"jpeg_decode must be cpu or device, got {self.jpeg_decode!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


MODEL_CONTROLS = ("none", "explicit")
"""``--model_control`` choices (see :class:`RepositoryConfig`)."""


@dataclass(frozen=True)
class RepositoryConfig:
    """A model directory of one folder per model (:mod:`predictor.repository`).

    Attributes:
        models: The model folders loaded at start (``--models a,b``); ``None``: every one.
        model_control: ``none`` (every model at start; the repository's load
            and unload calls refused) or ``explicit`` (Triton's mode: models
            loaded and unloaded by ``POST /v2/repository/models/NAME/load|unload``).
        model_settings: A folder of ``<name>.json`` settings, each over that
            model folder's ``histoserve.json`` (``--model_settings``).
        memory_budget: The most memory the loaded models may hold together:
            bytes (``8GiB``, ``512MiB``, ``1000000``) or a share of the
            device's memory (``90%``: of the first GPU's, on the CPU of the
            usable memory, the cgroup's limit when lower).
    """

    models: tuple[str, ...] | None = flag(
        None,
        "model_dir of one folder per model: the folders to load at start, comma-separated "
        "(default: every one)",
        type=names_list,
    )
    model_control: str = flag(
        "none",
        "none: every model at start, load/unload refused; explicit: models loaded and "
        "unloaded by POST /v2/repository/models/NAME/load|unload",
        choices=MODEL_CONTROLS,
    )
    model_settings: str | None = flag(
        None,
        "model_dir of one folder per model: a folder of NAME.json, each a model's settings "
        "over its folder's histoserve.json (the chart renders it from its models: values)",
    )
    memory_budget: str = flag(
        "90%",
        "most memory the loaded models may hold together: bytes (8GiB, 512MiB) or a share "
        "of the device's memory (on the CPU, of the usable memory); a load past it is refused",
    )

    def __post_init__(self) -> None:
        if self.model_control not in MODEL_CONTROLS:
            raise ConfigError(f"model_control must be none or explicit, got {self.model_control!r}")
        budget_bytes(self.memory_budget, 1)  # refuses a malformed value at start

    @property
    def settings_dir(self) -> Path | None:
        """``--model_settings`` as a path (None: each model folder's own settings alone)."""
        return Path(self.model_settings) if self.model_settings else None

    def budget_of(self, device_bytes: int) -> int:
        """``--memory_budget`` in bytes, for a device of ``device_bytes``."""
        return budget_bytes(self.memory_budget, device_bytes)


_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # fmt: skip


def budget_bytes(value: str, device_bytes: int) -> int:
    """A memory budget (``90%``, ``8GiB``, ``512MB``, ``1000``) in bytes.

    Raises:
        ConfigError: Neither a share in (0, 100] % nor a positive size.
    """
    text = value.strip().upper()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 < share <= 100:
                raise ValueError
            return int(device_bytes * share / 100)
        number = text.rstrip("KMGTIB")
        unit = text[len(number) :]
        size = int(float(number) * _UNITS[unit])
        if size < 1:
            raise ValueError
        return size
    except (ValueError, KeyError):
        raise ConfigError(
            f"memory_budget must be a share (90%) or a size (8GiB, 512MiB, 1000000), got {value!r}"
        ) from None


@dataclass(frozen=True)
class ServeConfig:
    """How the process serves: drain, the fast path, front ends and listeners.

    Also histoserve's defaults for three of KServe's own flags (``kserve=True``).

    Attributes:
        drain_timeout_s: Longest drain after SIGTERM.
        rest_fast_path: Answer V2 REST infer in front of FastAPI.
        frontends: Front-end processes (a number or ``auto``), checked by
            :func:`predictor.multiprocess.process.frontend_count`.
        bind_address: Where the HTTP and gRPC ports listen (None: everywhere).
        metrics_port: A port serving ``/metrics`` alone (0: none).
        log_format: ``text`` (as before) or ``json``: one JSON object a line with the
            model, package digest, request id and trace id
            (:mod:`predictor.http.json_logs`).
        grpc_max_receive_message_length: None: follow ``--max_body_bytes``, not
            gRPC's 4 MiB (32 raw tiles are ~4.8 MB); both gRPC limits are honoured
            (the send one bounds answers).
        grpc_max_send_message_length: As above, for answers.
        enable_latency_logging: KServe's per-request trace lines (its latency
            line, and the wall and CPU timing lines of its REST middleware: three
            lines per request) are off unless asked for: they were ~7% of the
            event loop's CPU (docs/performance.md).
        frontend_socket: Set by the supervisor for a front end: the owner's socket.
        frontend_index: This front end's index.
        frontend_http_fd: The HTTP listener a front end inherits.
        frontend_parent: The supervisor's pid (a front end dies with it).
    """

    drain_timeout_s: float = flag(30.0, "longest drain after SIGTERM", type=float)
    rest_fast_path: bool = flag(
        True,
        "answer POST /v2/models/{name}/infer in front of FastAPI (same answers, less CPU)",
        type=true_or_false,
    )
    frontends: str = flag(
        "1",
        "front-end processes sharing the HTTP and gRPC ports (stage 1, encoding) in front of "
        "one device owner: a number, or auto (the CPUs less one); 1 serves in one process",
        early=True,
    )
    bind_address: str | None = flag(
        None,
        "address the HTTP and gRPC ports listen on (127.0.0.1: this machine only, as "
        "make serve does); unset: every interface",
    )
    metrics_port: int = flag(
        0,
        "also serve GET /metrics on this port alone (a NetworkPolicy can then admit "
        "Prometheus to the metrics only); 0: /metrics on the HTTP port only",
        type=int,
    )
    log_format: str = flag(
        "text",
        "log lines as text, or json: one JSON object a line (time, level, logger, message, "
        "model, package_sha256, request_id, trace_id)",
        choices=("text", "json"),
    )
    grpc_max_receive_message_length: int | None = flag(None, kserve=True)
    grpc_max_send_message_length: int | None = flag(None, kserve=True)
    enable_latency_logging: bool = flag(False, kserve=True)
    frontend_socket: str | None = flag(None, hidden=True, early=True)
    frontend_index: int = flag(0, type=int, hidden=True, early=True)
    frontend_http_fd: int | None = flag(None, type=int, hidden=True)
    frontend_parent: int | None = flag(None, type=int, hidden=True, early=True)


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces (:mod:`predictor.tracing`): off unless an endpoint is set.

    Attributes:
        otel_endpoint: OTLP collector; HTTP gets ``/v1/traces`` appended, as the
            standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` does (which is honoured
            when the flag is unset, as are the other ``OTEL_*`` variables).
        otel_protocol: ``http/protobuf`` or ``grpc``; unset: ``OTEL_EXPORTER_OTLP_PROTOCOL``, else HTTP.
        otel_sample_ratio: Share of new traces recorded (a client's sampled
            flag is followed); unset: ``OTEL_TRACES_SAMPLER_ARG``'s, else all.
    """

    otel_endpoint: str | None = flag(
        None,
        "export OpenTelemetry traces (a span per request, its stages and batches) to this "
        "OTLP collector, e.g. http://otel-collector:4318 (/v1/traces appended); unset: "
        "OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing",
    )
    otel_protocol: str | None = flag(
        None,
        "OTLP transport: http/protobuf or grpc (unset: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)",
        choices=("http/protobuf", "grpc"),
    )
    otel_sample_ratio: float | None = flag(
        None,
        "share of new traces recorded, 0 to 1 (a client's sampled flag is followed); "
        "unset: OTEL_TRACES_SAMPLER_ARG, else 1",
        type=ratio,
    )

    def __post_init__(self) -> None:
        if self.otel_sample_ratio is not None and not 0.0 <= self.otel_sample_ratio <= 1.0:
            raise ConfigError(
                f"otel_sample_ratio must be within [0, 1], got {self.otel_sample_ratio}"
            )
