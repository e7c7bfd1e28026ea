"""One front-end process: HTTP and gRPC on the shared ports, stage 1 here, stage 2 in the owner.

Started by the supervisor as ``python -m predictor <the same flags>
--frontend_socket PATH --frontend_index I``. It connects to the device
owner, learns every model it serves (spec, class, name, batching, limits,
description: no package is loaded here) and, with model folders, the
repository's index; it attaches each model's slab and serves each model
with a :class:`~predictor.multiprocess.proxy.BatcherProxy` as its batcher,
all over one :class:`~predictor.multiprocess.proxy.OwnerLink`. Everything
a request costs in Python happens here: framing, JSON, base64, decoding,
validation (the 400s), encoding the answer, metrics. It serves the HTTP
socket the supervisor bound and it inherited (the kernel spreads connections
over the front ends accepting on it) and binds gRPC beside the supervisor's
reservation (:mod:`predictor.http.listeners`); once both listen it tells
the owner it serves. ``/metrics`` sums every process's series (Prometheus
multiprocess mode).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, exposition, multiprocess
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.families import load_model_class, server_model
from predictor.http.app import HistoModelServer
from predictor.model.base import BaseServerModel, FrontEnd
from predictor.model.metrics import create_metrics
from predictor.model.options import ServingOptions
from predictor.multiprocess.messages import recv_blocking, send_blocking
from predictor.multiprocess.proxy import OwnerLink
from predictor.multiprocess.shm import Slab, SlotLayout
from predictor.repository.repository import StartedRepository
from predictor.spec import spec_from_json

logger = logging.getLogger("histoserve")

OWNER_GONE_EXIT_S = 15.0


class FrontendServer(HistoModelServer):
    """The model server of one front end: a shared HTTP port and summed metrics.

    ``/config`` needs nothing of its own: a front end's model describes itself
    with the device owner's answer (:class:`~predictor.model.device_side.OwnerSide`).

    Args:
        on_listening: Called once every port listens (tells the owner it serves).
        **kwargs: :class:`HistoModelServer`'s arguments.
    """

    def __init__(self, *, on_listening: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_listening = on_listening

    def _configure_app(self, app: FastAPI) -> None:
        super()._configure_app(app)
        # Ahead of KServe's /metrics (the first matching route answers).
        app.router.routes.insert(0, Route("/metrics", summed_metrics, methods=["GET"]))

    def _listening(self) -> None:
        self._on_listening()


async def summed_metrics(request: Request) -> Response:
    """``/metrics`` over every process of the pod (``PROMETHEUS_MULTIPROC_DIR``)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    encoder, content_type = exposition.choose_encoder(request.headers.get("accept"))
    return Response(encoder(registry), headers={"content-type": content_type})


def connect(socket_path: str, index: int) -> tuple[socket.socket, dict[str, Any]]:
    """Connects to the device owner and says hello; its welcome (the models' descriptions).

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
    info: dict[str, Any], link: OwnerLink, config: ModelConfig
) -> BaseServerModel:
    """One of the owner's models, served here through a proxy of its batcher.

    Its class, spec, batching and limits are the owner's (a model folder's own
    settings included); a front end (:class:`~predictor.model.base.FrontEnd`):
    no package here.
    """
    spec = spec_from_json(info["spec"])
    cls = load_model_class(info["model_class"])
    name = info["name"]
    batching: BatchingConfig = info["batching"]
    limits: LimitsConfig = info["limits"]
    options = ServingOptions(
        batching=batching,
        limits=limits,
        preprocess_workers=config.preprocess_workers,
        name=name,
        instances_per_device=config.instances_per_device or 1,  # the owner's workers
    )
    slab = Slab.attach(info["slab"], SlotLayout(*info["layout"]))
    metrics = create_metrics(name)
    proxy = link.proxy(name, slab, batching.retry_after_s, on_reject=metrics.on_reject)
    model = server_model(
        spec,
        info["checkpoint"],
        model_class=cls,
        device="cpu",
        model_root=Path(info["model_root"]),
        options=options,
        metrics=metrics,
        front_end=FrontEnd(proxy, info["metadata"]),
    )
    model.load()
    return model


def _exit_later() -> None:
    """Drains and exits ``OWNER_GONE_EXIT_S`` after the owner went away (liveness fails meanwhile).

    The supervisor's death kills the front end outright (``PR_SET_PDEATHSIG``);
    this covers an owner that closed the connection while its process lives.
    """
    loop = asyncio.get_running_loop()
    loop.call_later(OWNER_GONE_EXIT_S, os.kill, os.getpid(), signal.SIGTERM)


def build_frontend(
    args: argparse.Namespace,
    config: ModelConfig,
    server_kwargs: dict[str, Any],
    folders: dict[str, Path] | None = None,
) -> tuple[FrontendServer, list[BaseServerModel], StartedRepository | None]:
    """Front end ``args.frontend_index``'s server and models, connected to the device owner.

    With model folders (``folders``), also the repository as the owner loaded
    it at start, which the front end answers the repository extension from.

    Raises:
        ConnectionError: The owner refused or closed the connection.
        StartupError: An owner's model class cannot be imported here.
    """
    sock, info = connect(args.frontend_socket, args.frontend_index)
    link = OwnerLink(sock, _exit_later)
    models = [build_frontend_model(m, link, config) for m in info["models"]]
    repository = None
    if folders is not None:
        repository = StartedRepository(Path(config.model_dir), folders, info["index"])
    server = FrontendServer(on_listening=link.tell_serving, **server_kwargs)
    logger.info("front end %d serving %s", args.frontend_index, ", ".join(m.name for m in models))
    return server, models, repository
