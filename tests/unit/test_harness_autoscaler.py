"""The autoscaler stand-in's algorithms (harness/autoscaler.py) on hand-made InferenceServices.

Each case is a rule the upstream documents state: HPA's ceil(current * value /
target) and its 10 % tolerance, the scale-down stabilisation window, the
default scale-up rate, KEDA's AverageValue over the query's total and its
activation from zero, KPA's utilisation, panic mode and scale-down delay.
"""

from __future__ import annotations

import pytest

from harness.autoscaler import Hpa, Kpa, policy_of


def _keda(behavior: dict | None = None, lo: int = 1, hi: int = 8) -> dict:
    metric = {"type": "External", "external": {
        "metric": {"backend": "prometheus", "query": 'sum(max by (pod) (histoserve_queue_depth{a="b"}))'},
        "target": {"type": "Value", "value": "64"}}}  # fmt: skip
    scaling = {"metrics": [metric], **({"behavior": behavior} if behavior else {})}
    return {"metadata": {"annotations": {"serving.kserve.io/autoscalerClass": "keda"}},
            "spec": {"predictor": {"minReplicas": lo, "maxReplicas": hi, "autoScaling": scaling}}}  # fmt: skip


def _kpa(delay: str = "0s") -> dict:
    return {"metadata": {"annotations": {"serving.kserve.io/deploymentMode": "Knative"}},
            "spec": {"predictor": {"minReplicas": 0, "maxReplicas": 4, "scaleMetric": "concurrency",
                                   "scaleTarget": 8,
                                   "annotations": {"autoscaling.knative.dev/scale-down-delay": delay}}}}  # fmt: skip


def test_policy_reads_series_and_target_from_the_query() -> None:
    p = policy_of(_keda())
    assert (p.autoscaler, p.metric, p.target, p.max_replicas) == (
        "keda",
        "histoserve_queue_depth",
        64,
        8,
    )


def test_keda_is_average_value_with_tolerance() -> None:
    hpa = Hpa(policy_of(_keda()), time_scale=1)
    assert hpa.raw(1, 256) == 4  # ceil(256 / 64)
    assert hpa.raw(2, 135) == 2  # 135 / 128 within 10 %
    assert hpa.raw(2, 150) == 3
    assert hpa.raw(0, 1) == 1 and hpa.raw(0, 0) == 0  # activation threshold 0


def test_scale_up_is_rate_limited_and_scale_down_stabilised() -> None:
    hpa = Hpa(policy_of(_keda({"scaleDown": {"stabilizationWindowSeconds": 300}}, hi=20)), 1)
    assert hpa.decide(0, 1, 64 * 12) == 5  # max(100 %, 4 pods) per 15 s from 1
    assert hpa.decide(1, 5, 0) == 5  # within 300 s the higher recommendation holds
    assert hpa.decide(400, 5, 0) == 1  # the window passed; clamped to minReplicas


def test_time_scale_divides_the_windows() -> None:
    hpa = Hpa(policy_of(_keda({"scaleDown": {"stabilizationWindowSeconds": 300}})), 100)
    hpa.decide(0, 2, 128)
    assert hpa.decide(3.1, 2, 0) == 1  # 300 s / 100


@pytest.mark.parametrize("delay, after", [("0s", 0), ("60s", 2)])
def test_kpa_panics_up_and_honours_the_scale_down_delay(delay: str, after: int) -> None:
    kpa = Kpa(policy_of(_kpa(delay)), time_scale=1)
    assert kpa.decide(0, 0, 1) == 1  # from zero: one request waiting at the activator
    assert kpa.decide(2, 1, 11.2) == 2  # 11.2 / (8 * 0.7) in the 6 s panic window: panic
    assert kpa.decide(4, 2, 0) == 2  # panic mode never scales down
    assert kpa.decide(60, 2, 0) == 2  # still in panic: the stable window (60 s) since it began
    assert kpa.decide(70, 2, 0) == after  # stable again; a scale-down delay keeps its maximum
