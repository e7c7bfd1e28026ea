"""One front-end process: HTTP and gRPC on the shared ports, stage 1 here, stage 2 in the owner.

Started by the supervisor as ``python -m predictor <the same flags>
--frontend_socket PATH --frontend_index I``. It connects to the device
owner, learns the model (spec, class, name, description: the package is
never loaded here), attaches its slab and serves the model with a
:class:`~predictor.frontends.proxy.BatcherProxy` as its batcher. Everything
a request costs in Python happens here: framing, JSON, base64, decoding,
validation (the 400s), encoding the answer, metrics. The HTTP port is bound
with ``SO_REUSEPORT`` (gRPC's server sets it itself), so the kernel spreads
connections over the front ends; ``/metrics`` sums every process's series
(Prometheus multiprocess mode).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, exposition, multiprocess
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.families import load_model_class
from predictor.frontends.messages import recv_blocking, send_blocking
from predictor.frontends.proxy import BatcherProxy
from predictor.frontends.shm import Slab, SlotLayout
from predictor.kserve_compat import serve_on_socket
from predictor.server.app import HistoModelServer
from predictor.serving.metrics import create_metrics
from predictor.serving.model import BaseServerModel
from predictor.serving.options import ServingOptions
from predictor.spec import spec_from_json

logger = logging.getLogger("histoserve")

OWNER_GONE_EXIT_S = 15.0


class FrontendServer(HistoModelServer):
    """The model server of one front end: a shared HTTP port, summed metrics, the owner's config.

    Args:
        owner_metadata: The device owner's ``GET /v2/models/{name}/config`` answer.
        **kwargs: :class:`HistoModelServer`'s arguments.
    """

    def __init__(self, *, owner_metadata: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner_metadata = owner_metadata

    def _configure_app(self, app: FastAPI) -> None:
        super()._configure_app(app)
        # Ahead of KServe's /metrics (the first matching route answers).
        app.router.routes.insert(0, Route("/metrics", summed_metrics, methods=["GET"]))

    async def _model_config(self, model_name: str) -> dict[str, Any]:
        await super()._model_config(model_name)  # 404 for another name
        return self._owner_metadata

    def _start_rest(self) -> Any:
        return serve_on_socket(self._http, reuse_port_socket(self.http_port, self._bind_address))


async def summed_metrics(request: Request) -> Response:
    """``/metrics`` over every process of the pod (``PROMETHEUS_MULTIPROC_DIR``)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    encoder, content_type = exposition.choose_encoder(request.headers.get("accept"))
    return Response(encoder(registry), headers={"content-type": content_type})


def reuse_port_socket(port: int, host: str | None = None) -> socket.socket:
    """A listening TCP socket on ``host:port`` that other front ends share (``SO_REUSEPORT``).

    ``host`` is ``--bind_address``; ``None`` listens on every IPv4 interface
    (``0.0.0.0``, as the one-process server's uvicorn does).

    Created with an explicit ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on
    an accepted connection only when its socket says so, and without it a
    response written in two parts waits on the client's delayed ACK (~40 ms).
    """
    host = "0.0.0.0" if host is None else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def connect(socket_path: str, index: int) -> tuple[socket.socket, dict[str, Any]]:
    """Connects to the device owner and says hello; its welcome (the model's description).

    Raises:
        ConnectionError: The owner refused or closed the connection.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    send_blocking(sock, ("hello", index, os.getpid()))
    kind, info = recv_blocking(sock)
    if kind != "welcome":
        raise ConnectionError(f"the device owner answered {kind!r} to hello")
    return sock, info


def build_frontend_model(
    info: dict[str, Any],
    sock: socket.socket,
    config: ModelConfig,
    batching: BatchingConfig,
    limits: LimitsConfig,
) -> BaseServerModel:
    """The owner's model class, served through a proxy of its batcher (no package here)."""
    spec = spec_from_json(info["spec"])
    cls = load_model_class(info["model_class"])
    name = info["name"]
    options = ServingOptions(
        batching=batching,
        limits=limits,
        preprocess_workers=config.preprocess_workers,
        name=name,
        instances_per_device=config.instances_per_device or 1,  # the owner's workers
    )
    slab = Slab.attach(info["slab"], SlotLayout(*info["layout"]))
    model = cls(
        spec,
        info["checkpoint"],
        device="cpu",
        model_root=Path(info["model_root"]),
        options=options,
        metrics=create_metrics(name),
        batcher=BatcherProxy(sock, slab, name, batching.retry_after_s, _exit_later),
    )
    model.load()
    return model


def _exit_later() -> None:
    """Drains and exits ``OWNER_GONE_EXIT_S`` after the owner went away (liveness fails meanwhile).

    In a container the owner is the main process, whose death ends the
    container; elsewhere this keeps front ends from outliving their owner.
    """
    loop = asyncio.get_running_loop()
    loop.call_later(OWNER_GONE_EXIT_S, os.kill, os.getpid(), signal.SIGTERM)


def build_frontend(
    args: argparse.Namespace,
    configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
    server_kwargs: dict[str, Any],
) -> tuple[FrontendServer, BaseServerModel]:
    """Front end ``args.frontend_index``'s server and model, connected to the device owner.

    Raises:
        ConnectionError: The owner refused or closed the connection.
        StartupError: The owner's model class cannot be imported here.
    """
    sock, info = connect(args.frontend_socket, args.frontend_index)
    model = build_frontend_model(info, sock, *configs)
    server = FrontendServer(owner_metadata=info["metadata"], **server_kwargs)
    logger.info("front end %d serving %s", args.frontend_index, model.name)
    return server, model
