"""KServe's per-request trace lines are off by default, and on when asked for.

Per request KServe writes up to three INFO lines to ``kserve.trace`` (its
latency line and the REST timing middleware's wall and CPU lines); they were
about 7% of the event loop's CPU on single-tile traffic (docs/performance.md,
"The request path (null model)").
The access log and errors are not on that logger and stay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from histoserve import HistoserveClient
from predictor.cli import build_parser, configure_trace_logging


@pytest.fixture
def trace_level() -> Iterator[None]:
    logger = logging.getLogger("kserve.trace")
    before = logger.level
    yield
    logger.setLevel(before)


def test_latency_logging_flag_defaults_off() -> None:
    assert build_parser().parse_args([]).enable_latency_logging is False
    args = build_parser().parse_args(["--enable_latency_logging", "true"])
    assert args.enable_latency_logging is True


def test_trace_logger_follows_the_flag(trace_level: None) -> None:
    configure_trace_logging(False)
    assert not logging.getLogger("kserve.trace").isEnabledFor(logging.INFO)
    assert logging.getLogger("kserve.trace").isEnabledFor(logging.WARNING)
    configure_trace_logging(True)
    assert logging.getLogger("kserve.trace").isEnabledFor(logging.INFO)


@pytest.mark.integration
@pytest.mark.parametrize("enabled", [False, True])
def test_server_writes_trace_lines_only_when_asked(
    enabled: bool, embedding_package_dir: Path, tmp_path: Path
) -> None:
    from harness.server import start_server

    flags = ("--enable_latency_logging", "true") if enabled else ()
    server = start_server(embedding_package_dir, tmp_path, *flags)
    try:
        tiles = np.zeros((1, 224, 224, 3), dtype=np.uint8)
        with HistoserveClient(server.base, server.model_name) as client:
            for _ in range(5):
                assert client.infer_pixels(tiles)["embedding"].shape == (1, 1536)
    finally:
        assert server.stop() == 0
    log = server.log()
    trace_lines = [line for line in log.splitlines() if "kserve.trace" in line]
    access_lines = [line for line in log.splitlines() if "/infer" in line and " 200" in line]
    assert len(access_lines) >= 5, log[-3000:]  # the access log stays
    if enabled:
        assert len(trace_lines) >= 5 * 3, log[-3000:]
    else:
        assert trace_lines == [], trace_lines[:5]
