"""The client's class of service: ``HistoserveClient(priority=...)``, and bulk for cohort runs."""

from __future__ import annotations

import numpy as np
import pytest

from harness.memory_transport import MemoryTransport
from histoserve.commands.aggregate import build_parser
from histoserve.embedding.config import EmbedConfig
from histoserve.errors import UsageError
from histoserve.heads.aggregate import AggregateConfig
from histoserve.remote.answers import AnswerCheck
from histoserve.remote.client import HistoserveClient

TILES = np.zeros((2, 8, 8, 3), np.uint8)
OUTPUTS = [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]}]


def _sent(priority: int | None) -> dict:
    from predictor.spec import resolve_spec

    config = {"spec": resolve_spec("h0-mini").to_dict(), "outputs": OUTPUTS}
    transport = MemoryTransport(
        "mem://a",
        lambda m, i, p: {"embedding": np.zeros((2, 4), np.float32)},
        {"model_name": "m", "parameters": {"package_sha256": "a" * 64}},
        lambda request: config,
    )
    with HistoserveClient("http://a", "m", transports=[transport], priority=priority) as client:
        client.infer({"pixels": TILES}, mode="embedding", check=AnswerCheck.decoded_by("pixels"))
    return transport.calls[0][2]


def test_the_client_sends_its_priority_with_every_request():
    assert _sent(1) == {"priority": 1, "mode": "embedding"}
    assert _sent(None) == {"mode": "embedding"} == _sent(0)  # the server's default


@pytest.mark.parametrize("bad", [-1, True, 2**63])
def test_a_bad_priority_is_refused_by_the_client(bad):
    with pytest.raises(ValueError, match="priority must be a whole number >= 0"):
        HistoserveClient("http://a", "m", priority=bad)


def test_cohort_runs_ask_for_bulk_by_default(tmp_path):
    assert EmbedConfig(urls=("http://a",), slides=(tmp_path,), out_dir=tmp_path).priority == 2
    args = build_parser().parse_args(["features", "--url", "http://a", "--model", "abmil"])
    assert args.priority == 2
    assert AggregateConfig(tmp_path, ("http://a",), "abmil").priority == 2
    with pytest.raises(UsageError, match="--priority must be in 0"):
        AggregateConfig(tmp_path, ("http://a",), "abmil", priority=-1)
