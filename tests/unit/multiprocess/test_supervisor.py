"""What the supervisor refuses before any front end starts: answers that cannot cross in a slot."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from predictor.config import BatchingConfig
from predictor.errors import StartupError
from predictor.model.family import OutputSpec
from predictor.multiprocess.supervisor import check_crossable, slot_layout


def _model(outputs: dict[str, tuple[str, list[int]]], extras: list[dict[str, Any]] = ()) -> Any:
    inputs = [{"name": "pixels", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}, *extras]
    specs = tuple(OutputSpec(n, t, tuple(s)) for n, (t, s) in outputs.items())
    family = SimpleNamespace(CROSSES_PROCESSES=True, outputs=lambda: specs)
    return SimpleNamespace(family=family, get_input_types=lambda: inputs)


def test_numeric_fixed_outputs_cross() -> None:
    check_crossable(_model({"embedding": ("FP32", [-1, 1536]), "mask": ("UINT8", [-1, 8, 8])}))


def test_a_bytes_output_is_refused_at_start_naming_it() -> None:
    """An object array would cross as raw pointers: the reading front end died with SIGSEGV."""
    with pytest.raises(StartupError, match="output 'labels' is BYTES"):
        check_crossable(_model({"embedding": ("FP32", [-1, 8]), "labels": ("BYTES", [-1])}))


@pytest.mark.parametrize(
    ("outputs", "extras", "name"),
    [
        ({"tokens": ("FP32", [-1, -1, 768])}, [], "tokens"),
        ({"embedding": ("FP32", [-1, 8])}, [{"name": "rna", "shape": [-1, -1]}], "rna"),
    ],
)
def test_a_dynamic_dimension_beyond_the_batch_is_refused(outputs, extras, name) -> None:
    """It was sized as one element: every request to such a model was a 503."""
    with pytest.raises(StartupError, match=f"'{name}' has shape .* dynamic beyond the batch axis"):
        check_crossable(_model(outputs, extras))


def _keeper() -> Any:
    from predictor.multiprocess.children import Children, RestartPolicy
    from predictor.multiprocess.supervisor import Supervisor

    keeper = Supervisor(models=[], argv=[], slabs=[{}, {}], listeners=(None, None))
    keeper._children = Children(lambda i: [], [], lambda c, code: None, RestartPolicy(3, 60.0))
    return keeper


def _exit(keeper: Any, pid: int, index: int = 0) -> None:
    child = SimpleNamespace(index=index, proc=SimpleNamespace(pid=pid))
    keeper._on_exit(child, -9)


def test_a_front_end_that_exits_before_serving_stops_the_pod_with_exit_2() -> None:
    async def run() -> int:
        keeper = _keeper()
        keeper._on_ready(100)
        _exit(keeper, 101, index=1)  # never said it serves
        assert keeper._stopping.is_set()
        return keeper._exit_code

    assert asyncio.run(run()) == 2


def test_restarts_past_the_budget_stop_the_pod_with_exit_1() -> None:
    async def run() -> tuple[int, bool]:
        keeper = _keeper()
        for pid in range(200, 204):
            keeper._on_ready(pid)
            _exit(keeper, pid)
            await asyncio.sleep(0)
        return keeper._exit_code, keeper._stopping.is_set()

    assert asyncio.run(run()) == (1, True)  # three restarts allowed, the fourth exit stops it


def test_the_slab_holds_every_class_s_queue_as_the_model_resolved_it() -> None:
    """A front end may hold ``max_queue_size`` tiles in each class of service, and the
    slab is sized from the model's own batching (a family may resolve the flags: the
    raw flags sized it before), so no slot runs out while admission still admits."""
    model = _model({"embedding": ("FP32", [-1, 8])})
    model.model_spec = SimpleNamespace(tile_size=224)
    model.batching = BatchingConfig(max_batch_size=8, max_queue_size=64, priority_levels=3)
    assert slot_layout(model, workers=2).slots == 2 * (3 * 64 + 8 * 2)
