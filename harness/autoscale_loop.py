"""A closed autoscaling loop on loopback: real replicas, real shards, a FAKE autoscaler.

Real: the ``python -m predictor`` replicas (the demo package), their
``/metrics``, SIGTERM and the server's drain, and the ``histoserve embed``
shards that are the load. Stand-ins: the Service (:mod:`harness.service`),
Prometheus (a scrape of every live replica each scrape interval), a cold node
(a settable delay before a replica's real start-up and model load) and the
autoscaler (:mod:`harness.autoscaler`, fed the chart's rendered
InferenceService). The load is a ramp: phase ``i`` runs ``ramp[i]`` shards
(``--shard j/n`` of that phase's slides, one output folder a phase) until all
exit; the next phase starts then. :func:`run_loop` returns every sample and
event; :mod:`harness.autoscale_report` turns them into figures.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from harness.autoscaler import SCRAPE_S, Hpa, Kpa, policy_of
from harness.embed import embed_command
from harness.server import Server, start_server
from harness.service import LoopbackService
from harness.waiting import wait_until

SAMPLE_S = 0.25
SHARD_TIMEOUT_S = 600.0
_VALUE = r"^{name}\{{[^}}]*\}} ([0-9.e+-]+)$"


@dataclass
class LoopConfig:
    """One run: the rendered InferenceService, the package, the load and the clock.

    ``time_scale``: every autoscaling period (sync, windows, delays, the
    Prometheus scrape, the activator's hold) is divided by it.
    ``cold_start_s``: a new replica's wait before its real start-up (a cold
    node: provisioning, image pull), in this run's (scaled) seconds.
    """

    isvc: dict
    package_dir: Path
    work: Path
    manifests: list[Path]  # one per phase: slide_id,path
    ramp: tuple[int, ...]
    time_scale: float = 20.0
    cold_start_s: float = 1.0
    server_flags: tuple[str, ...] = ("--instances_per_device", "1")
    embed_flags: tuple[str, ...] = ("--batch-size", "32", "--concurrency", "4", "--no-qc")


@dataclass
class Replica:
    """One replica's life: requested, ready, told to stop, gone (loop seconds)."""

    requested: float
    server: Server | None = None
    ready: float | None = None
    stopping: float | None = None
    gone: float | None = None
    tiles: float = 0.0
    cpu_s: float = 0.0


@dataclass
class LoopResult:
    """Samples (dicts), replica lives, phases ``(start, end, shards)``, shard exit codes."""

    samples: list[dict] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    phases: list[tuple[float, float, int]] = field(default_factory=list)
    decisions: list[tuple[float, int]] = field(default_factory=list)
    shard_codes: list[int] = field(default_factory=list)
    shard_logs: list[Path] = field(default_factory=list)
    outs: list[Path] = field(default_factory=list)
    responses_503: int = 0


def _value(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(_VALUE.format(name=name), text, re.M))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a replica's process tree (what cAdvisor reports for its container)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


class Loop:
    """Runs :class:`LoopConfig`: see the module docstring."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg, self.policy = cfg, policy_of(cfg.isvc)
        hold = float(cfg.isvc["spec"]["predictor"].get("timeout", 0)) / cfg.time_scale
        self.service = LoopbackService([], hold_s=hold if self.policy.autoscaler == "kpa" else 0)
        self.result = LoopResult()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._prom: dict = {}
        self._last_cpu: dict[int, tuple[float, float]] = {}

    def now(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------- replicas
    def live(self) -> list[Replica]:
        """Replicas that count towards spec.replicas (requested, not told to stop)."""
        return [r for r in self.result.replicas if r.stopping is None]

    def ready(self) -> list[Replica]:
        return [r for r in self.live() if r.ready is not None]

    def scale_to(self, n: int) -> None:
        with self._lock:
            live = self.live()
            for _ in range(n - len(live)):
                replica = Replica(requested=self.now())
                self.result.replicas.append(replica)
                threading.Thread(target=self._start, args=(replica,), daemon=True).start()
            excess = max(0, len(live) - n)
            # not yet ready first, then the newest: the oldest, warm replicas stay
            victims = sorted(live, key=lambda r: (r.ready is not None, -r.requested))[:excess]
            for replica in victims:
                replica.stopping = self.now()
                if replica.server is not None and replica.ready is not None:
                    self.service.remove(replica.server.http_port)
                    threading.Thread(target=self._stop, args=(replica,), daemon=True).start()

    def _start(self, replica: Replica) -> None:
        if self._done.wait(self.cfg.cold_start_s):  # the cold node: a modelled delay
            return
        server = start_server(self.cfg.package_dir, self.cfg.work / "logs", *self.cfg.server_flags)
        with self._lock:
            replica.server = server
            if replica.stopping is None:
                replica.ready = self.now()
                self.service.add(server.http_port)
                return
        self._stop(replica)  # scaled in while starting

    def _stop(self, replica: Replica) -> None:
        assert replica.server is not None
        replica.server.stop()  # SIGTERM: the server drains
        replica.gone = self.now()

    # ------------------------------------------------------------- metrics
    def _scrape(self) -> dict:
        """One Prometheus scrape of every replica with a process: per-replica series."""
        queue = inflight = cpu = 0.0
        with self._lock:
            running = [r for r in self.result.replicas if r.server and r.gone is None]
        for r in running:
            try:
                text = httpx.get(f"{r.server.base}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            r.tiles = _value(text, "histoserve_tiles_total")
            if r.stopping is None and r.ready is not None:
                queue += _value(text, "histoserve_queue_depth")
                inflight += _value(text, "histoserve_inflight_requests")
                cpu += self._cpu_percent(r)
        ready = len(self.ready())
        return {"t": self.now(), "queue": queue, "inflight": inflight,
                "cpu_avg": cpu / ready if ready else 0.0, "ready": ready,
                "replicas": len(self.live()), "waiting": self.service.waiting,
                "tiles": sum(r.tiles for r in self.result.replicas)}  # fmt: skip

    def _cpu_percent(self, r: Replica) -> float:
        now, used = time.monotonic(), _cpu_seconds(r.server.pid)
        then, before = self._last_cpu.get(r.server.pid, (now, used))
        self._last_cpu[r.server.pid] = (now, used)
        if now - then <= 0:
            return 0.0
        return (
            100.0 * (used - before) / (now - then) / self.policy.cpu_request
            if self.policy.cpu_request
            else 0.0
        )

    def _sampler(self) -> None:
        scrape_every, last = SCRAPE_S / self.cfg.time_scale, -1e9
        while not self._done.is_set():
            sample = self._scrape()
            self.result.samples.append(sample)
            if sample["t"] - last >= scrape_every:
                self._prom, last = sample, sample["t"]
            self._done.wait(SAMPLE_S)  # the sampling period, not a synchronisation

    def _autoscaler(self) -> None:
        p = self.policy
        decide = (Kpa if p.autoscaler == "kpa" else Hpa)(p, self.cfg.time_scale)
        period = p.period_s / self.cfg.time_scale
        while not self._done.wait(period):  # the autoscaler's period
            current = len(self.live())
            if p.autoscaler == "kpa":
                latest = self.result.samples[-1] if self.result.samples else {}
                value = latest.get("inflight", 0.0) + self.service.waiting
                want = decide.decide(self.now(), len(self.ready()), value)
            else:
                if not self._prom:
                    continue
                value = self._prom["cpu_avg"] if p.metric == "cpu" else self._prom["queue"]
                want = decide.decide(self.now(), current, value)
            if want != current:
                self.result.decisions.append((self.now(), want))
                self.scale_to(want)

    # ------------------------------------------------------------- load
    def _phase(self, index: int, shards: int) -> None:
        out = self.cfg.work / f"out-{index}"
        self.result.outs.append(out)
        procs = []
        for j in range(shards):
            log_path = self.cfg.work / f"shard-{index}-{j}.log"
            self.result.shard_logs.append(log_path)
            argv = embed_command("--manifest", self.cfg.manifests[index], "--url", self.service.url,
                                 "--out", out, "--shard", f"{j}/{shards}", "--progress", "plain",
                                 *self.cfg.embed_flags)  # fmt: skip
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        start = self.now()
        self.result.shard_codes += [p.wait(SHARD_TIMEOUT_S) for p in procs]
        self.result.phases.append((start, self.now(), shards))

    def run(self, settle_s: float = 0.0) -> LoopResult:
        """The ramp under the autoscaler; then ``settle_s`` more (scale-in after the load)."""
        self.scale_to(self.policy.min_replicas)
        floor = self.policy.min_replicas  # the release is installed and ready before the cohort
        wait_until(lambda: len(self.ready()) >= floor, "the minReplicas to be ready", timeout_s=180)
        threads = [
            threading.Thread(target=f, daemon=True) for f in (self._sampler, self._autoscaler)
        ]
        for t in threads:
            t.start()
        try:
            for i, shards in enumerate(self.cfg.ramp):
                self._phase(i, shards)
            self._done.wait(settle_s)  # watching the scale-in after the load, by design
        finally:
            self._done.set()
            for t in threads:
                t.join(30)
            self.service.close()
            with self._lock:
                for r in self.result.replicas:
                    if r.stopping is None:
                        r.stopping = self.now()
            for r in self.result.replicas:
                if r.server is not None and r.gone is None:
                    self._stop(r)
        self.result.responses_503 = sum(
            r.server.log().count('HTTP/1.1" 503') for r in self.result.replicas if r.server
        )
        return self.result


def run_loop(cfg: LoopConfig, settle_s: float = 0.0) -> LoopResult:
    """Runs one closed loop (see :class:`Loop`); every replica is stopped on return."""
    return Loop(cfg).run(settle_s)
