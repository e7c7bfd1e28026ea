"""The before/after serving study's arithmetic (the servers themselves: ``python -m
bench.studies.serving_ab``, not run by ``make test``)."""

from __future__ import annotations

import pytest

from bench.studies.serving_ab import _figure, _row, markdown


def test_the_ratio_is_of_medians_and_failed_rounds_are_counted_not_averaged() -> None:
    row = _row("demo", "batched", "v2-pixels", 16, 32, {
        "after": [600.0, None, 660.0, 630.0], "before": [500.0, 700.0, 600.0],
    })  # fmt: skip
    assert row["median"] == {"after": 630.0, "before": 600.0}
    assert row["after_over_before"] == pytest.approx(1.05)
    assert row["failed_rounds"] == {"after": 1, "before": 0}
    assert row["unit"] == "tiles/s"
    table = markdown([row], "abc1234")
    assert (
        "| demo | batched (v2-pixels, 16x32) | tiles/s | 500.0-700.0 | 600.0-660.0 | 1.05 |"
        in table
    )


def test_a_server_failing_every_round_has_no_ratio() -> None:
    row = _row("null", "idle", "v2-pixels", 1, 1, {"after": [None], "before": [1.2]})
    assert row["after_over_before"] is None and row["unit"] == "p50 ms"
    assert "| p50 ms | 1.2-1.2 | failed | n/a |" in markdown([row], "x")


def test_a_cell_with_errors_is_no_figure() -> None:
    assert _figure("batched", {"throughput": 10.0, "errors": {"503": 2}}) is None
    assert _figure("batched", {"throughput": 10.0, "errors": {}}) == 10.0
    assert _figure("idle", {"p50_ms": 1.5, "throughput": 10.0}) == 1.5
