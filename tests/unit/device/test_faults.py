"""The test-only fault hook: parsing and which batches it fails."""

from __future__ import annotations

import pytest
import torch

from predictor.device.faults import FATAL_MESSAGE, parse_fault_spec
from predictor.errors import ForwardError

TILE = torch.zeros(3, 4, 4, dtype=torch.uint8)


def _outcomes(hook, n, tiles=(TILE,)):
    results = []
    for _ in range(n):
        try:
            hook.check(list(tiles))
            results.append(True)
        except ForwardError:
            results.append(False)
    return results


def test_nth_and_every():
    assert _outcomes(parse_fault_spec("nth:2,4"), 5) == [True, False, True, False, True]
    assert _outcomes(parse_fault_spec("every:3"), 6) == [True, True, False, True, True, False]


def test_rate_is_seeded_and_roughly_right():
    a = _outcomes(parse_fault_spec("rate:0.3:7"), 400)
    assert a == _outcomes(parse_fault_spec("rate:0.3:7"), 400)
    assert 0.2 < a.count(False) / 400 < 0.4


def test_marker_fails_only_batches_holding_the_marker_tile():
    hook = parse_fault_spec("marker:7")
    assert _outcomes(hook, 1) == [True]
    assert _outcomes(hook, 1, tiles=(TILE, torch.full((3, 4, 4), 7, dtype=torch.uint8))) == [False]


def test_fatal_raises_a_sticky_looking_error():
    hook = parse_fault_spec("fatal:1")
    with pytest.raises(RuntimeError, match="illegal memory access") as err:
        hook.check([TILE])
    assert str(err.value) == FATAL_MESSAGE


@pytest.mark.parametrize("spec", ["nope:1", "every:0", "rate:x", "nth:"])
def test_bad_specs_name_the_value(spec):
    with pytest.raises(ValueError, match="fault_injection"):
        parse_fault_spec(spec)
