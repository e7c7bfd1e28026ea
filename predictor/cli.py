"""Command line of the server: ``python -m predictor`` and ``histoserve serve``.

All of KServe's ``ModelServer`` flags plus histoserve's (README, "Serving
flags"), each of histoserve's declared once as a field of a config in
:mod:`predictor.config` (:mod:`predictor.flags`). Parsing, environment reads and metric registration happen here, in
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
from typing import Any

from predictor.config import (
    BatchingConfig,
    LimitsConfig,
    ModelConfig,
    RepositoryConfig,
    ServeConfig,
    TracingConfig,
)
from predictor.device.cpus import available_cpus, resolve_instances
from predictor.flags import add_flags, config_from

logger = logging.getLogger("histoserve")

EXIT_STARTUP_ERROR = 2


# Each config's flags and their --help group, in --help's order.
FLAG_GROUPS = (
    (ModelConfig, "model"),
    (RepositoryConfig, "model repository"),
    (BatchingConfig, "batching"),
    (LimitsConfig, "input limits"),
    (ServeConfig, "serving"),
    (TracingConfig, "tracing"),
)


def build_parser() -> argparse.ArgumentParser:
    """The serve parser: KServe's flags, then histoserve's, made from the configs' fields."""
    from predictor.kserve.compat import model_server_parser

    parser = argparse.ArgumentParser(
        prog="histoserve serve",
        parents=[model_server_parser()],
        description="Serve a histopathology .pt2 tile model over KServe V1/V2 REST and V2 gRPC.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for config, title in FLAG_GROUPS:
        add_flags(parser, config, title)
    parser.set_defaults(preprocess_workers=available_cpus())  # the machine's, not the config's
    return parser


def early_flags(argv: Sequence[str]) -> argparse.Namespace:
    """The flags read before any heavy import (``early=True``), from the same declarations."""
    early = argparse.ArgumentParser(prog="histoserve serve", add_help=False)
    add_flags(early, ServeConfig, only=lambda declared: declared.early)
    return early.parse_known_args(argv)[0]


def early_frontends(argv: Sequence[str]) -> tuple[int, int | None]:
    """``(front ends, this front end's index or None)`` from the flags, before any heavy import.

    Each process of a several-front-end pod must set up its metrics folder
    and log tag before ``prometheus_client`` is imported (KServe imports it).

    Raises:
        ValueError: A ``--frontends`` value that is neither ``auto`` nor >= 1.
    """
    from predictor.multiprocess.process import frontend_count

    known = early_flags(argv)
    index = known.frontend_index if known.frontend_socket else None
    return frontend_count(known.frontends, available_cpus()), index


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, BatchingConfig, LimitsConfig]:
    """Frozen configs from parsed flags; a bad value raises ConfigError naming it."""
    return (
        config_from(ModelConfig, args),
        config_from(BatchingConfig, args),
        config_from(LimitsConfig, args),
    )


def server_kwargs(args: argparse.Namespace, limits: LimitsConfig) -> dict[str, Any]:
    """The server's arguments from the parsed flags (KServe's own and :class:`ServeConfig`)."""
    serving: ServeConfig = config_from(ServeConfig, args)
    return dict(
        drain_timeout_s=serving.drain_timeout_s,
        max_body_bytes=limits.max_body_bytes,
        grpc_max_receive_bytes=serving.grpc_max_receive_message_length,
        grpc_max_send_bytes=serving.grpc_max_send_message_length,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        bind_address=serving.bind_address,
        workers=args.workers,
        max_threads=args.max_threads,
        max_asyncio_workers=args.max_asyncio_workers,
        enable_grpc=args.enable_grpc,
        grace_period=int(serving.drain_timeout_s) + 5,
        enable_latency_logging=serving.enable_latency_logging,
        rest_fast_path=serving.rest_fast_path,
        json_logs=serving.log_format == "json",
    )


def configure_trace_logging(enabled: bool) -> None:
    """KServe's per-request trace logger (``kserve.trace``) on or off.

    It carries only per-request lines (``Model.__call__``'s latency line and
    the REST timing middleware's wall/CPU lines); errors and the access log
    go elsewhere and are untouched. Call after the server is built: KServe
    configures logging in its constructor.
    """
    from predictor.kserve.compat import KSERVE_TRACE_LOGGER_NAME

    level = logging.INFO if enabled else logging.WARNING
    logging.getLogger(KSERVE_TRACE_LOGGER_NAME).setLevel(level)


def serve(argv: Sequence[str] | None = None) -> int:
    """Parses flags, binds the ports, loads the model (fail-fast) and serves until drained."""
    import faulthandler

    from histoserve.extras import server_extra_missing

    if not faulthandler.is_enabled():  # a native crash prints the Python stack, never nothing
        faulthandler.enable(all_threads=True)
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
    if args.log_format == "json":
        from predictor.http.json_logs import use_json_logs

        use_json_logs()
    try:
        return _serve(args, argv, frontends, index)
    except (StartupError, ConnectionError) as exc:  # a bug is a traceback (exit 1)
        print(f"histoserve: cannot start: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR


def _serve(args: argparse.Namespace, argv: list[str], frontends: int, index: int | None) -> int:
    """Ports first (a taken one stops start-up before any package loads), then model and server."""
    supervisor = index is None and frontends > 1
    start_metrics_port(args, index)
    model_config, batching, limits = configs_from_args(args)
    start_tracing(
        args, "owner" if supervisor else "server" if index is None else f"frontend-{index}"
    )
    try:
        return _serve_traced(args, argv, frontends, index, (model_config, batching, limits))
    finally:
        from predictor import tracing

        tracing.shutdown()


def _serve_traced(
    args: argparse.Namespace,
    argv: list[str],
    frontends: int,
    index: int | None,
    configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
) -> int:
    """:func:`_serve`'s work once tracing is set up (it flushes the spans however this ends)."""
    from predictor.http.listeners import open_listeners

    supervisor = index is None and frontends > 1
    model_config, batching, limits = configs
    folders = repository_folders(args, model_config, frontends)
    listeners = open_listeners(
        args.bind_address, args.http_port, args.grpc_port,
        shared=supervisor, grpc=args.enable_grpc, inherited_http_fd=args.frontend_http_fd,
    )  # fmt: skip
    if index is not None:  # a front end: the device owner has the packages
        return _serve_frontend(args, index, model_config, listeners[0], folders)
    if folders is not None:
        return _serve_repository(args, argv, frontends, folders, configs, listeners)
    from predictor.startup import build_model

    if supervisor:
        models = [build_model(model_config, batching, limits)]
        return _supervise(args, argv, frontends, models, listeners)
    from predictor.http.app import HistoModelServer

    server = HistoModelServer(**server_kwargs(args, limits), http_socket=listeners[0])
    model = build_model(model_config, batching, limits)
    _serving(args, [model])
    server.start([model])
    return 0


def _serving(args: argparse.Namespace, models: Sequence[Any]) -> None:
    """What every process does once its models are built, before it serves: logs set up
    (KServe's server configured logging again), the serving line, the collector's settings."""
    from predictor.http import gc_policy

    model_config, batching, limits = configs_from_args(args)
    configure_trace_logging(args.enable_latency_logging)
    if args.log_format == "json":  # KServe's server configured logging again: ours once more
        from predictor.http.json_logs import set_served, use_json_logs

        if len(models) == 1:
            set_served(models[0].name, models[0].served.package_sha256)
        use_json_logs()
    logger.info(
        "serving %s: batching %s, limits %s, %d decode pool threads",
        ", ".join(m.name for m in models) or "no model yet",
        asdict(batching),
        asdict(limits),
        model_config.preprocess_workers,
    )
    gc_policy.apply()  # after the heavy start-up heap exists (see predictor.http.gc_policy)


def _supervise(
    args: argparse.Namespace,
    argv: list[str],
    frontends: int,
    models: list[Any],
    listeners: tuple[Any, Any],
    repository: Any = None,
) -> int:
    """The device owner of ``models`` and keeper of ``frontends`` front ends, until drained."""
    from predictor.multiprocess.supervisor import Supervisor

    _serving(args, models)
    model_config = configs_from_args(args)[0]
    workers = resolve_instances(model_config.instances_per_device, "cpu", available_cpus())
    keeper = Supervisor.prepare(models, frontends, argv, workers, listeners, repository)
    return keeper.run(args.drain_timeout_s)


def repository_folders(
    args: argparse.Namespace, model_config: ModelConfig, frontends: int
) -> dict[str, Any] | None:
    """``--model_dir``'s model folders, or None for today's one-package layout.

    Raises:
        ConfigError: ``--models`` without model folders, model folders with
            ``--model_name`` (one package's name), or several front ends with
            ``--model_control explicit`` (front ends learn the model set once,
            at start).
    """
    from predictor.errors import ConfigError
    from predictor.repository.layout import model_folders

    folders = model_folders(model_config.model_dir, model_config.checkpoint)
    if folders is None:
        if args.models:
            raise ConfigError(
                f"--models needs a --model_dir of one folder per model; {model_config.model_dir} "
                "holds one package (or --checkpoint names it)"
            )
        return None
    if model_config.model_name:
        raise ConfigError(
            f"--model_name names the one model of a one-package --model_dir; each model of "
            f"{model_config.model_dir} is named by its folder"
        )
    if frontends > 1 and args.model_control == "explicit":
        raise ConfigError(
            f"--frontends {frontends} with --model_control explicit: each front end learns the "
            "models the device owner loaded at start and cannot follow a later load or "
            "unload; serve model folders with --frontends > 1 under --model_control none "
            "(every model at start), or load and unload with --frontends 1"
        )
    return folders


def _serve_repository(
    args: argparse.Namespace,
    argv: list[str],
    frontends: int,
    folders: dict[str, Any],
    configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
    listeners: tuple[Any, Any],
) -> int:
    """Serves a ``--model_dir`` of one folder per model (:mod:`predictor.repository`):
    in this process, or as the device owner of ``frontends`` front ends."""
    from predictor.startup import build_repository

    control: RepositoryConfig = config_from(RepositoryConfig, args)
    if frontends > 1:
        repository, models = build_repository(folders, configs, control, args.drain_timeout_s)
        return _supervise(args, argv, frontends, models, listeners, repository)
    from predictor.http.app import HistoModelServer

    server = HistoModelServer(**server_kwargs(args, configs[2]), http_socket=listeners[0])
    repository, models = build_repository(folders, configs, control, args.drain_timeout_s)
    _serving(args, models)
    server.start(models, repository)
    return 0


def _serve_frontend(
    args: argparse.Namespace,
    index: int,
    model_config: ModelConfig,
    http_socket: Any,
    folders: dict[str, Any] | None,
) -> int:
    """Front end ``index``: the device owner's models, served through proxies of their batchers."""
    from predictor.multiprocess.frontend import build_frontend

    limits = configs_from_args(args)[2]
    kwargs = {**server_kwargs(args, limits), "http_socket": http_socket, "grpc_reuse_port": True}
    server, models, repository = build_frontend(args, model_config, kwargs, folders)
    _serving(args, models)
    server.start(models, repository)
    return 0


def start_tracing(args: argparse.Namespace, process: str) -> None:
    """OpenTelemetry traces when ``--otel_endpoint`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``) is set.

    Before the server is built: the front door installs its tracing
    middleware and interceptor only when tracing is on.
    """
    from predictor import tracing

    config: TracingConfig = config_from(TracingConfig, args)
    settings = tracing.TracingSettings(
        config.otel_endpoint, config.otel_protocol, config.otel_sample_ratio, process
    )
    if tracing.setup(settings):
        logger.info("OpenTelemetry traces on (%s)", process)


def start_metrics_port(args: argparse.Namespace, frontend_index: int | None) -> None:
    """``--metrics_port``'s listener, in the owner's (or only) process: front ends never bind it.

    Started before the model loads, so a port that cannot be bound fails at
    once (:class:`~predictor.errors.ConfigError`, exit 2).
    """
    if frontend_index is None:
        from predictor.http.metrics_port import maybe_start

        maybe_start(args.metrics_port, args.bind_address)


def set_up_process(frontend_index: int | None, argv: Sequence[str]) -> None:
    """Metrics folder (the parent makes it), log tag and, for a front end, death with its parent."""
    from predictor.multiprocess.process import die_with_parent, prepare_metrics_dir, tag_log_lines

    if frontend_index is None:
        prepare_metrics_dir()
    else:
        die_with_parent(early_flags(argv).frontend_parent)
    tag_log_lines("owner" if frontend_index is None else f"frontend-{frontend_index}")
