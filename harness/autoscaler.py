"""A FAKE autoscaler: the documented HPA, KEDA and Knative KPA algorithms on a rendered InferenceService.

Everything it scales on is read from the chart's rendered ``InferenceService``
(never a copy of the values): class, metric, target, min and max replicas,
``behavior``, the KPA annotations, the KEDA query. The algorithms are the
upstream documents' (Kubernetes HPA ``desired = ceil(current * value /
target)`` skipped within a 10 % tolerance, stabilisation windows, rate
policies; KEDA's Prometheus scaler as an External ``AverageValue`` metric fed
to that HPA, with its activation threshold; Knative's KPA stable and panic
windows over concurrency, target utilisation 70 %, scale-down delay). Every
period is divided by ``time_scale`` so a run takes minutes, not hours.

What the cluster fills in that the chart does not render is a default here,
named as such: HPA sync 15 s and its default behavior; KEDA's activation
threshold 0 (its 30 s polling interval only times activation from zero,
which no KEDA preset uses, minReplicas 1: not modelled); Prometheus scrape
30 s; Knative's stable window 60 s, panic window 10 % of it, panic threshold
200 %.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1
KEDA_ACTIVATION = 0.0
SCRAPE_S = 30.0
KPA_WINDOW_S = 60.0
KPA_PANIC_PERCENT = 10.0
KPA_PANIC_THRESHOLD = 2.0
KPA_UTILIZATION = 0.7
KPA_TICK_S = 2.0
_DEFAULT_UP = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
               "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15},
                            {"type": "Pods", "value": 4, "periodSeconds": 15}]}  # fmt: skip
_DEFAULT_DOWN = {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                 "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}  # fmt: skip
_SERIES = re.compile(r"\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


@dataclass(frozen=True)
class Policy:
    """What the rendered InferenceService says about scaling (see :func:`policy_of`)."""

    autoscaler: str  # hpa, keda, kpa
    metric: str  # cpu, or the Prometheus series (keda), or concurrency (kpa)
    target: float
    min_replicas: int
    max_replicas: int
    behavior: dict[str, Any] = field(default_factory=dict)
    cpu_request: float = 0.0
    kpa_window_s: float = KPA_WINDOW_S
    kpa_scale_down_delay_s: float = 0.0

    @property
    def period_s(self) -> float:
        """How often the autoscaler decides (unscaled)."""
        return {"hpa": HPA_SYNC_S, "keda": HPA_SYNC_S, "kpa": KPA_TICK_S}[self.autoscaler]


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)([smh])", text))


def _cpu(text: str) -> float:
    return float(text[:-1]) / 1000 if str(text).endswith("m") else float(text)


def policy_of(isvc: dict) -> Policy:
    """The :class:`Policy` of a rendered ``InferenceService`` (Standard HPA/KEDA or Knative KPA).

    Raises:
        ValueError: a class or metric this stand-in does not model (named).
    """
    meta, pred = isvc["metadata"].get("annotations", {}), isvc["spec"]["predictor"]
    lo, hi = int(pred.get("minReplicas", 1)), int(pred.get("maxReplicas", 1))
    if meta.get("serving.kserve.io/deploymentMode") == "Knative":
        ann = pred.get("annotations", {})
        if pred.get("scaleMetric") != "concurrency":
            raise ValueError(
                f"KPA metric {pred.get('scaleMetric')!r}: only concurrency is modelled"
            )
        return Policy("kpa", "concurrency", float(pred["scaleTarget"]), lo, hi,
                      kpa_window_s=_seconds(ann.get("autoscaling.knative.dev/window", "60s")),
                      kpa_scale_down_delay_s=_seconds(
                          ann.get("autoscaling.knative.dev/scale-down-delay", "0s")))  # fmt: skip
    cls = meta["serving.kserve.io/autoscalerClass"]
    (metric,) = pred["autoScaling"]["metrics"]
    behavior = pred["autoScaling"].get("behavior", {})
    if cls == "hpa" and metric["type"] == "Resource" and metric["resource"]["name"] == "cpu":
        (container,) = pred["containers"]
        request = _cpu(container["resources"]["requests"]["cpu"])
        target = float(metric["resource"]["target"]["averageUtilization"])
        return Policy("hpa", "cpu", target, lo, hi, behavior, cpu_request=request)
    if cls == "keda" and metric["type"] == "External":
        query = metric["external"]["metric"]["query"]
        series = _SERIES.search(query)
        if not query.startswith("sum(max by (") or series is None:
            raise ValueError(f"KEDA query {query!r}: only sum(max by (pod) (SERIES{{...}}))")
        target = float(metric["external"]["target"]["value"])
        return Policy("keda", series.group(1), target, lo, hi, behavior)
    raise ValueError(f"autoscaler {cls!r} with metric {metric!r} is not modelled")


class Hpa:
    """The Kubernetes HPA's decision for one metric, with ``behavior`` (KEDA feeds one too)."""

    def __init__(self, policy: Policy, time_scale: float) -> None:
        self.policy, self.scale = policy, time_scale
        self.up = {**_DEFAULT_UP, **policy.behavior.get("scaleUp", {})}
        self.down = {**_DEFAULT_DOWN, **policy.behavior.get("scaleDown", {})}
        self._recommendations: deque[tuple[float, int]] = deque()
        self._events: deque[tuple[float, int]] = deque()

    def raw(self, current: int, value: float) -> int:
        """``ceil(current * value / target)``, or ``current`` within the tolerance.

        ``value``: the per-replica average (CPU %) or, for KEDA's External
        AverageValue metric, the query's total (then ``current`` cancels out).
        """
        p = self.policy
        if p.autoscaler == "keda":
            if current == 0:
                return 1 if value > KEDA_ACTIVATION else 0
            ratio = value / (p.target * current)
        else:
            ratio = value / p.target
        if abs(ratio - 1.0) <= HPA_TOLERANCE:
            return current
        return math.ceil(current * ratio)

    def decide(self, now: float, current: int, value: float) -> int:
        """The replicas to run after this sync: stabilised, rate-limited, clamped."""
        desired = self.raw(current, value)
        self._recommendations.append((now, desired))
        horizon = max(self._window(self.up), self._window(self.down))
        while self._recommendations and self._recommendations[0][0] < now - horizon:
            self._recommendations.popleft()
        ups = [r for t, r in self._recommendations if t >= now - self._window(self.up)]
        downs = [r for t, r in self._recommendations if t >= now - self._window(self.down)]
        if desired > current:
            desired = max(current, min(ups))
            desired = min(desired, self._limit(now, current, self.up, +1))
        elif desired < current:
            desired = min(current, max(downs))
            desired = max(desired, self._limit(now, current, self.down, -1))
        desired = min(max(desired, self.policy.min_replicas), self.policy.max_replicas)
        if desired != current:
            self._events.append((now, desired - current))
        return desired

    def _window(self, rules: dict) -> float:
        return float(rules["stabilizationWindowSeconds"]) / self.scale

    def _limit(self, now: float, current: int, rules: dict, sign: int) -> int:
        if rules.get("selectPolicy") == "Disabled":
            return current
        bounds = []
        for rule in rules["policies"]:
            period = float(rule["periodSeconds"]) / self.scale
            moved = sum(d for t, d in self._events if t >= now - period and d * sign > 0)
            start = current - moved
            if rule["type"] == "Pods":
                bounds.append(start + sign * int(rule["value"]))
            else:
                step = start * float(rule["value"]) / 100
                bounds.append(math.ceil(start + step) if sign > 0 else math.floor(start - step))
        pick = max if (rules.get("selectPolicy", "Max") == "Max") == (sign > 0) else min
        return pick(bounds)


class Kpa:
    """Knative's KPA on concurrency: stable and panic windows, utilisation, scale-down delay."""

    def __init__(self, policy: Policy, time_scale: float) -> None:
        self.policy, self.scale = policy, time_scale
        self.window_s = policy.kpa_window_s / time_scale
        self.panic_s = self.window_s * KPA_PANIC_PERCENT / 100
        self.delay_s = policy.kpa_scale_down_delay_s / time_scale
        self._samples: deque[tuple[float, float]] = deque()
        self._decisions: deque[tuple[float, int]] = deque()
        self._panic_until = -math.inf
        self._panic_floor = 0

    def decide(self, now: float, ready: int, concurrency: float) -> int:
        """Replicas wanted given the total concurrency seen now (all pods plus the activator's)."""
        self._samples.append((now, concurrency))
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()
        per_pod = self.policy.target * KPA_UTILIZATION

        def mean(span: float) -> float:
            vals = [c for t, c in self._samples if t >= now - span]
            return sum(vals) / len(vals)

        stable = math.ceil(mean(self.window_s) / per_pod)
        panic = math.ceil(mean(self.panic_s) / per_pod)
        if ready and panic / ready >= KPA_PANIC_THRESHOLD:
            self._panic_until = now + self.window_s
        if now < self._panic_until:
            self._panic_floor = max(self._panic_floor, panic, ready)
            want = self._panic_floor  # panic mode never scales down
        else:
            self._panic_floor = 0
            want = stable
        self._decisions.append((now, want))
        while self._decisions and self._decisions[0][0] < now - self.delay_s:
            self._decisions.popleft()
        want = max(d for _, d in self._decisions)  # scale-down delay: the window's maximum
        return min(max(want, self.policy.min_replicas), self.policy.max_replicas)
