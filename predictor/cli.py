"""Command line of the server: ``python -m predictor`` and ``histoserve serve``.

All of KServe's ``ModelServer`` flags plus histoserve's (README, "Serving
flags"). Parsing, environment reads and metric registration happen here, in
functions called from :func:`serve`, never at import. Start-up is fail-fast: a
missing, corrupt, incompatible or spec-inconsistent checkpoint exits 2 with
one clear line before the server reports ready.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from predictor.config import FORWARD_RUNNERS, BatchingConfig, LimitsConfig, ModelConfig
from predictor.device.cpus import available_cpus, resolve_instances

logger = logging.getLogger("histoserve")

EXIT_STARTUP_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The serve parser: KServe's flags plus histoserve's."""
    from predictor.kserve_compat import model_server_parser

    parser = argparse.ArgumentParser(
        prog="histoserve serve",
        parents=[model_server_parser()],
        description="Serve a histopathology .pt2 tile model over KServe V1/V2 REST and V2 gRPC.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # None means "follow --max_body_bytes", not gRPC's 4 MiB (32 raw tiles are ~4.8 MB);
    # both gRPC limits are honoured (the send one bounds answers).
    # KServe's per-request trace lines (its latency line, and the wall and CPU
    # timing lines of its REST middleware: three lines per request) are off
    # unless asked for: they were ~7% of the event loop's CPU (docs/performance.md).
    parser.set_defaults(
        model_name=None,
        grpc_max_receive_message_length=None,
        grpc_max_send_message_length=None,
        enable_latency_logging=False,
    )
    batching, limits = BatchingConfig(), LimitsConfig()
    add = parser.add_argument
    add("--model_dir", type=Path, default=Path("/opt/ml/model"), help="where checkpoints live")
    add("--checkpoint", default=None, help="file name in model_dir (default: the only *.pt2)")
    add("--spec", default=None, help="built-in spec name or spec file; overrides the embedded one")
    add("--device", default="auto", help="auto (every visible GPU, else cpu), cpu, cuda or cuda:N")
    add("--max_batch_size", type=int, default=batching.max_batch_size, help="tiles per forward")
    add(
        "--max_latency_ms",
        type=float,
        default=batching.max_latency_ms,
        help="longest wait to fill a batch",
    )
    add(
        "--max_queue_size",
        type=int,
        default=batching.max_queue_size,
        help="tiles waiting before 503",
    )
    add("--preprocess_workers", type=int, default=available_cpus(), help="stage-1 threads")
    add("--drain_timeout_s", type=float, default=30.0, help="longest drain after SIGTERM")
    add("--max_tiles_per_request", type=int, default=limits.max_tiles_per_request)
    add(
        "--max_tiles_per_slide",
        type=int,
        default=limits.max_tiles_per_slide,
        help="slide models: most tiles in one slide's features (also bounded by the package)",
    )
    add(
        "--max_image_pixels",
        type=int,
        default=limits.max_image_pixels,
        help="decoded size cap (bombs)",
    )
    add(
        "--max_body_bytes",
        type=int,
        default=limits.max_body_bytes,
        help="HTTP body / gRPC message cap",
    )
    add(
        "--forward_runner",
        choices=FORWARD_RUNNERS,
        default="auto",
        help="torch's AOTI loader, or gil_free: the package's C ABI with the GIL released "
        "(CPU only); auto: gil_free on the CPU (torch's loader where it cannot serve the "
        "package, one log line), torch on a GPU",
    )
    add(
        "--instances_per_device",
        type=_instances,
        default=None,
        help="device workers per device on one shared queue (CPU or each GPU); auto (the "
        "default): 2 on the CPU, each with half the cores' threads, 1 on a GPU",
    )
    add(
        "--rest_fast_path",
        type=_strtobool,
        default=True,
        help="answer POST /v2/models/{name}/infer in front of FastAPI (same answers, less CPU)",
    )
    add(
        "--model_class",
        default=None,
        help="MODULE:CLASS of a predictor.BaseServerModel subclass to serve "
        "(default: the spec family's class)",
    )
    add(
        "--allow_tf32",
        type=_strtobool,
        default=False,
        help="fp32 packages on CUDA: cuBLAS/cuDNN matmuls in TF32 (faster, ~1e-3 relative error)",
    )
    add(
        "--frontends",
        default="1",
        help="front-end processes sharing the HTTP and gRPC ports (stage 1, encoding) in front of "
        "one device owner: a number, or auto (the CPUs less one); 1 serves in one process",
    )
    add(
        "--bind_address",
        default=None,
        help="address the HTTP and gRPC ports listen on (127.0.0.1: this machine only, as "
        "make serve does); unset: every interface",
    )
    add(
        "--metrics_port",
        type=int,
        default=0,
        help="also serve GET /metrics on this port alone (a NetworkPolicy can then admit "
        "Prometheus to the metrics only); 0: /metrics on the HTTP port only",
    )
    add("--fault_injection", default=None, help=argparse.SUPPRESS)
    add("--frontend_socket", default=None, help=argparse.SUPPRESS)  # set for a front end
    add("--frontend_index", type=int, default=0, help=argparse.SUPPRESS)
    add("--frontend_http_fd", type=int, default=None, help=argparse.SUPPRESS)
    add("--frontend_parent", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def early_frontends(argv: Sequence[str]) -> tuple[int, int | None]:
    """``(front ends, this front end's index or None)`` from the flags, before any heavy import.

    Each process of a several-front-end pod must set up its metrics folder
    and log tag before ``prometheus_client`` is imported (KServe imports it).

    Raises:
        ValueError: A ``--frontends`` value that is neither ``auto`` nor >= 1.
    """
    from predictor.frontends.process import frontend_count

    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--frontends", default="1")
    early.add_argument("--frontend_socket", default=None)
    early.add_argument("--frontend_index", type=int, default=0)
    known, _ = early.parse_known_args(argv)
    index = known.frontend_index if known.frontend_socket else None
    return frontend_count(known.frontends, available_cpus()), index


def _instances(value: str) -> int | None:
    """``auto`` (None: :func:`predictor.device.cpus.resolve_instances` decides) or a count."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number, got {value!r}"
        ) from None


def _strtobool(value: str) -> bool:
    """``true``/``false`` (and KServe's other spellings) for boolean flags."""
    from predictor.kserve_compat import strtobool

    return strtobool(value)


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, BatchingConfig, LimitsConfig]:
    """Frozen configs from parsed flags; a bad value raises ConfigError naming it."""
    model = ModelConfig(
        model_dir=args.model_dir,
        checkpoint=args.checkpoint,
        spec=args.spec,
        model_name=args.model_name,
        device=args.device,
        preprocess_workers=args.preprocess_workers,
        fault_injection=args.fault_injection,
        forward_runner=args.forward_runner,
        instances_per_device=args.instances_per_device,
        model_class=args.model_class,
        allow_tf32=args.allow_tf32,
    )
    batching = BatchingConfig(
        max_batch_size=args.max_batch_size,
        max_latency_ms=args.max_latency_ms,
        max_queue_size=args.max_queue_size,
    )
    limits = LimitsConfig(
        max_tiles_per_request=args.max_tiles_per_request,
        max_tiles_per_slide=args.max_tiles_per_slide,
        max_image_pixels=args.max_image_pixels,
        max_body_bytes=args.max_body_bytes,
    )
    return model, batching, limits


def server_kwargs(args: argparse.Namespace, limits: LimitsConfig) -> dict[str, Any]:
    """The server's arguments from the parsed flags."""
    return dict(
        drain_timeout_s=args.drain_timeout_s,
        max_body_bytes=limits.max_body_bytes,
        grpc_max_receive_bytes=args.grpc_max_receive_message_length,
        grpc_max_send_bytes=args.grpc_max_send_message_length,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        bind_address=args.bind_address,
        workers=args.workers,
        max_threads=args.max_threads,
        max_asyncio_workers=args.max_asyncio_workers,
        enable_grpc=args.enable_grpc,
        grace_period=int(args.drain_timeout_s) + 5,
        enable_latency_logging=args.enable_latency_logging,
        rest_fast_path=args.rest_fast_path,
    )


def configure_trace_logging(enabled: bool) -> None:
    """KServe's per-request trace logger (``kserve.trace``) on or off.

    It carries only per-request lines (``Model.__call__``'s latency line and
    the REST timing middleware's wall/CPU lines); errors and the access log
    go elsewhere and are untouched. Call after the server is built: KServe
    configures logging in its constructor.
    """
    from predictor.kserve_compat import KSERVE_TRACE_LOGGER_NAME

    level = logging.INFO if enabled else logging.WARNING
    logging.getLogger(KSERVE_TRACE_LOGGER_NAME).setLevel(level)


def serve(argv: Sequence[str] | None = None) -> int:
    """Parses flags, binds the ports, loads the model (fail-fast) and serves until drained."""
    from histoserve.extras import server_extra_missing

    if server_extra_missing("serve"):
        return EXIT_STARTUP_ERROR
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        frontends, index = early_frontends(argv)
    except ValueError as exc:
        print(f"histoserve: cannot start: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR
    if frontends > 1 or index is not None:
        set_up_process(index, argv)  # before prometheus_client is imported
    from predictor.errors import StartupError

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return _serve(args, argv, frontends, index)
    except (StartupError, ConnectionError) as exc:  # a bug is a traceback (exit 1)
        print(f"histoserve: cannot start: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR


def _serve(args: argparse.Namespace, argv: list[str], frontends: int, index: int | None) -> int:
    """Ports first (a taken one stops start-up before any package loads), then model and server."""
    from predictor.server import gc_policy
    from predictor.server.listeners import open_listeners

    supervisor = index is None and frontends > 1
    start_metrics_port(args, index)
    model_config, batching, limits = configs_from_args(args)
    listeners = open_listeners(
        args.bind_address, args.http_port, args.grpc_port,
        shared=supervisor, grpc=args.enable_grpc, inherited_http_fd=args.frontend_http_fd,
    )  # fmt: skip
    server, model = build_serving(args, index, (model_config, batching, limits), listeners[0])
    configure_trace_logging(args.enable_latency_logging)
    logger.info(
        "serving %s: batching %s, limits %s, %d preprocess workers",
        model.name,
        asdict(batching),
        asdict(limits),
        model_config.preprocess_workers,
    )
    gc_policy.apply()  # after the heavy start-up heap exists (see predictor.server.gc_policy)
    if supervisor:
        from predictor.frontends.supervisor import Supervisor

        workers = resolve_instances(model_config.instances_per_device, "cpu", available_cpus())
        keeper = Supervisor.prepare(model, frontends, argv, (batching, workers), listeners)
        return keeper.run(args.drain_timeout_s)
    server.start([model])
    return 0


def build_serving(
    args: argparse.Namespace,
    frontend_index: int | None,
    configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
    http_socket: Any = None,
) -> tuple[Any, Any]:
    """The server and the loaded model; a front end's model reaches the device owner instead."""
    model_config, batching, limits = configs
    kwargs = {**server_kwargs(args, limits), "http_socket": http_socket}
    if frontend_index is not None:  # a front end: the device owner has the package
        from predictor.frontends.frontend import build_frontend

        return build_frontend(args, configs, {**kwargs, "grpc_reuse_port": True})
    from predictor.server.app import HistoModelServer
    from predictor.startup import build_model

    server = HistoModelServer(**kwargs)
    return server, build_model(model_config, batching, limits)


def start_metrics_port(args: argparse.Namespace, frontend_index: int | None) -> None:
    """``--metrics_port``'s listener, in the owner's (or only) process: front ends never bind it.

    Started before the model loads, so a port that cannot be bound fails at
    once (:class:`~predictor.errors.ConfigError`, exit 2).
    """
    if frontend_index is None:
        from predictor.server.metrics_port import maybe_start

        maybe_start(args.metrics_port, args.bind_address)


def set_up_process(frontend_index: int | None, argv: Sequence[str]) -> None:
    """Metrics folder (the parent makes it), log tag and, for a front end, death with its parent."""
    from predictor.frontends.process import die_with_parent, prepare_metrics_dir, tag_log_lines

    if frontend_index is None:
        prepare_metrics_dir()
    else:
        early = argparse.ArgumentParser(add_help=False)
        early.add_argument("--frontend_parent", type=int, default=None)
        die_with_parent(early.parse_known_args(argv)[0].frontend_parent)
    tag_log_lines("owner" if frontend_index is None else f"frontend-{frontend_index}")
