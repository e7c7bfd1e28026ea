"""Every PromQL expression the project ships, evaluated by a real Prometheus scraping real servers.

One Prometheus (Debian's binary, ``make prometheus``; :mod:`harness.prometheus`)
scrapes two real servers on loopback, each on its ``--metrics_port``, with
the labels the chart's PodMonitor gives a predictor pod (``namespace``,
``pod``, ``container``); the first is also scraped by a second job, as a
ServiceMonitor or the ``prometheus.io/*`` annotations would, which the
chart warns of. A stand-in dcgm-exporter (a GPU exporter cannot run here: a
page of fixed ``DCGM_FI_DEV_GPU_UTIL`` series, labelled as the real one
labels them) is scraped twice too.

The queries: the chart's KEDA queries as helm renders them from every
preset and CI values file that autoscales on Prometheus, the dashboard's
panel targets (``charts/histoserve/dashboards/histoserve.json``, Grafana's
variables filled in) and the inline PromQL of the docs. Each is evaluated at
three moments: on the freshly started servers, under load, and while each
server holds a known number of tiles in its queues (a bulk request of
``max_batch_size + k`` tiles: a full batch runs, ``k`` tiles wait out
``--max_latency_ms``; then an interactive one, priority 1, of ``j`` tiles,
which wait with them). Each must return a series at every moment, finite
under load and held, and at the fresh and held moments the same numbers as
itself with every selector held to one scrape job (one series per replica,
what each server's own ``/metrics`` says, checked against the servers' own
pages); the held queue depth is the servers' own sum (6 + 4 bulk and 3 + 2
interactive: 15, not 21), the interactive class's 3 + 2.

Series only a cluster exporter provides (``kube_*``) are named in
:data:`CLUSTER_ONLY` and only checked to parse. A deliberately broken query
of each kind fails the same check (:func:`test_a_broken_query_fails_the_check`).

``HISTOSERVE_DASHBOARD_PNG=docs/dashboard.png`` also draws the dashboard from
these results (:mod:`harness.dashboard_picture`).
"""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.prometheus import (
    Prometheus,
    PromQLError,
    Sample,
    at_now,
    dashboard_targets,
    docs_queries,
    fill_dashboard_variables,
    find_prometheus,
    one_job,
    same,
    series_of,
    start_prometheus,
)
from harness.server import Server, free_port, start_server
from harness.tiles import random_tiles
from harness.waiting import wait_until
from histoserve import HistoserveClient, InferenceError
from histoserve.wire import encode_request
from tests.chart.helpers import (
    CHART,
    FULLNAME,
    NAMESPACE,
    PREDICTOR,
    REPO,
    find_helm,
    helm_template,
    missing,
    parse_docs,
    template_key,
)

pytestmark = pytest.mark.integration

DASHBOARD = CHART / "dashboards" / "histoserve.json"
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", CHART / "README.md"]
PODS = (f"{PREDICTOR}-6c5d9f7b8d-x2k4p", f"{PREDICTOR}-6c5d9f7b8d-q7m3n")
POD_JOB = f"{NAMESPACE}/{FULLNAME}"  # what the Prometheus Operator names a PodMonitor's job
SECOND_JOB = PREDICTOR  # a ServiceMonitor's job: the Service's name
DCGM_JOB, DCGM_SECOND_JOB = "gpu-operator/nvidia-dcgm-exporter", "dcgm-exporter-annotations"
ONE_JOB = {"histoserve_": POD_JOB, "DCGM_": DCGM_JOB}
TWO_GPU_NAMESPACE = "histo-2gpu"
DOCS_RELEASE = "h0-histoserve-"  # the docs' examples install release h0
DASHBOARD_VARIABLES = {
    "namespace": NAMESPACE,
    "pod": f"{PREDICTOR}-.*",
    "model": ".*",
    "__rate_interval": "1m",
}
CLUSTER_ONLY = {
    "kube_deployment_spec_replicas": "kube-state-metrics: a Deployment's desired replicas",
}
"""Series a cluster exporter provides and nothing here can: their queries must parse only."""
MAX_BATCH, HELD, HELD_URGENT = 8, (6, 4), (3, 2)
LOAD_S = 3.0
# dcgm-exporter's labels (it names the pod using each GPU); Prometheus renames them
# exported_namespace / exported_pod (no honor_labels), as the presets say
GPU_UTIL = {  # (namespace, pod index, gpu) -> percent busy
    (NAMESPACE, 0, "0"): 70.0,
    (NAMESPACE, 1, "1"): 50.0,
    (TWO_GPU_NAMESPACE, 0, "0"): 60.0,
    (TWO_GPU_NAMESPACE, 0, "1"): 40.0,
    (TWO_GPU_NAMESPACE, 1, "2"): 90.0,
    (TWO_GPU_NAMESPACE, 1, "3"): 30.0,
}


def _gpu_truth(namespace: str) -> float:
    """What the GPU query must say: the sum over replicas of each one's mean GPU busy."""
    per_pod: dict[int, list[float]] = {}
    for (ns, pod, _), value in GPU_UTIL.items():
        if ns == namespace:
            per_pod.setdefault(pod, []).append(value)
    return sum(sum(v) / len(v) for v in per_pod.values())


def _dcgm_page() -> bytes:
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    for (namespace, pod, gpu), value in GPU_UTIL.items():
        labels = (
            f'gpu="{gpu}",UUID="GPU-0000000{gpu}",device="nvidia{gpu}",modelName="NVIDIA H100",'
            f'container="kserve-container",namespace="{namespace}",pod="{PODS[pod]}"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value}")
    return ("\n".join(lines) + "\n").encode()


class _DcgmStandIn(http.server.BaseHTTPRequestHandler):
    page = _dcgm_page()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: object) -> None:
        return


@dataclass(frozen=True)
class Moment:
    """A time every query is evaluated at, and what it must hold there."""

    name: str
    at: float
    compare: bool  # the same numbers as one job's (the fresh and held moments: nothing moves)
    finite: bool  # no NaN (an empty histogram's quantile is NaN on fresh servers)


@dataclass(frozen=True)
class Observed:
    prometheus: Prometheus
    moments: tuple[Moment, ...]
    servers_held: tuple[dict[str, float], ...]  # each server's own /metrics at the held moment
    servers: tuple[Server, ...]  # the first logs JSON
    package_sha256: str


QUEUE = "histoserve_queue_depth{model=h0-mini,priority=2}"  # bulk: the default class
URGENT_QUEUE = "histoserve_queue_depth{model=h0-mini,priority=1}"
FORWARDS = "histoserve_forward_seconds_count{model=h0-mini}"
BATCHES = "histoserve_batch_size_count{model=h0-mini}"


def _own_samples(port: int) -> dict[str, float]:
    """A server's own ``/metrics`` page: ``name{labels}`` -> value."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _scrape_configs(metrics_ports: tuple[int, int], dcgm_port: int) -> list[dict]:
    def target(port: int, pod: str) -> dict:
        labels = {"namespace": NAMESPACE, "pod": pod, "container": "kserve-container"}
        return {"targets": [f"127.0.0.1:{port}"], "labels": labels}

    exporter = {
        "targets": [f"127.0.0.1:{dcgm_port}"],
        "labels": {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"},
    }
    return [
        {
            "job_name": POD_JOB,
            "static_configs": [target(p, pod) for p, pod in zip(metrics_ports, PODS, strict=True)],
        },
        {"job_name": SECOND_JOB, "static_configs": [target(metrics_ports[0], PODS[0])]},
        {"job_name": DCGM_JOB, "static_configs": [exporter]},
        {"job_name": DCGM_SECOND_JOB, "static_configs": [exporter]},
    ]


def _load(servers: list[Server], stop: threading.Event) -> int:
    """8-tile requests (one full batch each: none waits) and a few bad ones, until ``stop``."""
    tiles = random_tiles(MAX_BATCH, seed=3)
    bad = np.zeros((1, 100, 100, 3), dtype=np.uint8)
    sent = 0
    with (
        HistoserveClient(servers[0].base, servers[0].model_name) as a,
        HistoserveClient(servers[1].base, servers[1].model_name) as b,
    ):
        clients = [a, a, b]  # the doubly scraped replica gets the most
        while not stop.is_set():
            for client in clients:
                client.infer_pixels(tiles)
                sent += 1
            if sent % 9 == 0:
                with pytest.raises(InferenceError):
                    a.infer_pixels(bad)
    return sent


@pytest.fixture(scope="module")
def observed(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    binary = find_prometheus()
    if binary is None:
        missing("prometheus not found (/usr/bin/prometheus or PATH): run `make prometheus`")
    logs = tmp_path_factory.mktemp("prom")
    ports = (free_port(), free_port())
    flags = ("--max_batch_size", str(MAX_BATCH), "--max_latency_ms", "5000")
    json_logs = ("--log_format", "json")  # the first server's log: test_json_logs_*
    servers = [
        start_server(
            embedding_package_dir, logs, *flags, *more, "--metrics_port", str(p), wait=False
        )
        for p, more in zip(ports, (json_logs, ()), strict=True)
    ]
    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _DcgmStandIn)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    prometheus = None
    try:
        configs = _scrape_configs(ports, dcgm.server_address[1])
        prometheus = start_prometheus(binary, configs, logs / "prometheus")  # as the servers load
        for server in servers:
            server.wait_ready()
        wait_until(lambda: _scraped_twice(prometheus), "two scrapes of every target")
        fresh = Moment("fresh", at_now(), compare=True, finite=False)

        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(_load, servers, stop)
            start = at_now()
            wait_until(lambda: at_now() - start >= LOAD_S or load.done(), "load", interval_s=0.2)
            under = Moment("under load", at_now(), compare=False, finite=True)
            stop.set()
            assert load.result() > 0

        held, own = _hold(servers, ports, prometheus)
        digest = (embedding_package_dir / "h0-mini.pt2.sha256").read_text().split()[0]
        yield Observed(prometheus, (fresh, under, held), own, tuple(servers), digest)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for server in servers:
            server.stop()
        dcgm.shutdown()


def _hold(
    servers: list[Server], ports: tuple[int, int], prometheus: Prometheus
) -> tuple[Moment, tuple[dict[str, float], ...]]:
    """Each server holds HELD bulk and HELD_URGENT interactive tiles in its queues; the
    moment every job has scraped them."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = [
            pool.submit(_infer, server, random_tiles(MAX_BATCH + k, seed=k))
            for server, k in zip(servers, HELD, strict=True)
        ]
        wait_until(
            lambda: all(_own_samples(p)[QUEUE] == k for p, k in zip(ports, HELD, strict=True)),
            "the bulk tiles held",
            interval_s=0.05,
        )
        answers += [
            pool.submit(_infer, server, random_tiles(j, seed=10 + j), 1)
            for server, j in zip(servers, HELD_URGENT, strict=True)
        ]

        def scraped_held() -> tuple[dict[str, float], ...] | None:
            """The servers' own pages once every series but the sampled device ones stands
            still (the queue held, every dispatched batch's forward counted) and every
            job's last scrape holds the same."""
            own = tuple(_own_samples(p) for p in ports)
            for mine, held, urgent in zip(own, HELD, HELD_URGENT, strict=True):
                if (mine[QUEUE], mine[URGENT_QUEUE]) != (held, urgent):
                    return None
                if mine[FORWARDS] != mine[BATCHES]:
                    return None
            want = {
                (pod, job, name): own[i][name]
                for i, pod, job in (
                    (0, PODS[0], POD_JOB),
                    (0, PODS[0], SECOND_JOB),
                    (1, PODS[1], POD_JOB),
                )
                for name in (QUEUE, URGENT_QUEUE, FORWARDS)
            }
            seen = {}
            for name in (QUEUE, URGENT_QUEUE, FORWARDS):
                selector = name.replace("=", '="').replace(",", '",').replace("}", '"}')
                for sample in prometheus.query(selector):
                    seen[(sample.labels["pod"], sample.labels["job"], name)] = sample.value
            return own if seen == want else None

        own = wait_until(scraped_held, "both jobs scraped the held queues", interval_s=0.1)
        moment = Moment("held", at_now(), compare=True, finite=True)
        for future in answers:
            future.result()
    return moment, own


def _infer(server: Server, tiles: np.ndarray, priority: int | None = None) -> None:
    with HistoserveClient(
        server.base, server.model_name, timeout_s=60, priority=priority
    ) as client:
        assert client.infer_pixels(tiles)["embedding"].shape[0] == len(tiles)


# --------------------------------------------------------------------------- the check


def _identity(sample: Sample) -> tuple[tuple[str, str], ...]:
    """A series' labels but the scrape's own (job, instance): what names one replica's series."""
    return tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("job", "instance")))


def _tolerance(expr: str) -> float | None:
    """How near one job's numbers ``expr`` must come (None: not compared, duplicates only).

    A rate: the two jobs scrape a counter at other instants (a doubled sum is 1.5x or
    more). The device series: the server samples them every second, so two jobs' scrapes
    hold other samples; memory moves little, utilisation anything.
    """
    names = series_of(expr)
    if "histoserve_device_utilization_ratio" in names:
        return None
    if "[" in expr or "histoserve_device_memory_bytes" in names:
        return 0.25
    return 1e-9


def check_query(prometheus: Prometheus, expr: str, moments: tuple[Moment, ...]) -> list[str]:
    """What is wrong with ``expr`` at ``moments`` (empty: nothing).

    At every moment: Prometheus accepts it and it returns a series (finite where
    the moment wants); where the moment compares, each series equals its value
    with every selector held to one scrape job, and no series comes twice.
    """
    problems = []
    one = one_job(expr, ONE_JOB)
    for moment in moments:
        try:
            got = prometheus.query(expr, moment.at)
            want = prometheus.query(one, moment.at) if moment.compare else []
        except PromQLError as exc:
            return [f"refused: {exc}"]
        if not got:
            problems.append(f"{moment.name}: no series")
            continue
        if moment.finite and not all(math.isfinite(s.value) for s in got):
            problems.append(f"{moment.name}: not finite: {[s.value for s in got]}")
        if not moment.compare:
            continue
        keys = [_identity(s) for s in got]
        if len(set(keys)) != len(keys):
            problems.append(f"{moment.name}: a replica's series comes twice: {got}")
            continue
        rel = _tolerance(expr)
        if rel is None:
            continue
        truth = {_identity(s): s.value for s in want}
        for key, sample in zip(keys, got, strict=True):
            if key not in truth or not same(sample.value, truth[key], rel):
                problems.append(
                    f"{moment.name}: {dict(key)} = {sample.value}, one job's = {truth.get(key)}"
                )
    return problems


# --------------------------------------------------------------------------- the queries


def chart_queries() -> list[tuple[str, str]]:
    """``(values file, query)``: the KEDA query of every preset and CI file that has one,
    and the GPU query for two GPUs a replica (rendered in its own namespace)."""
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    claim = {"storage.pvc.existingClaim": "histo-models"}  # as the presets' comments say
    presets = sorted((CHART / "presets").glob("keda-*.yaml"))
    renders = [(f, template_key(values=[f], set_json=claim)) for f in presets]
    renders += [(f, template_key(values=[f])) for f in sorted((CHART / "ci").glob("*keda*.yaml"))]
    two_gpus = template_key(
        values=[CHART / "presets" / "keda-gpu-utilization.yaml"],
        set_json={**claim, "gpu.count": 2},
        extra=("--namespace", TWO_GPU_NAMESPACE),
    )
    renders.append((Path("keda-gpu-utilization.yaml with gpu.count=2"), two_gpus))
    out = []
    for path, key in renders:
        for obj in parse_docs(helm_template(helm, key)):
            if obj.get("kind") != "InferenceService":
                continue
            for metric in obj["spec"]["predictor"].get("autoScaling", {}).get("metrics", []):
                query = metric.get("external", {}).get("metric", {}).get("query")
                if query:
                    out.append((path.name, query))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (where, fill_dashboard_variables(expr, DASHBOARD_VARIABLES))
        for where, expr in dashboard_targets(dashboard)
    ]


def documented_queries() -> list[tuple[str, str]]:
    placeholders = {"<namespace>": NAMESPACE, "<name>": FULLNAME, DOCS_RELEASE: f"{FULLNAME}-"}
    out: list[tuple[str, str]] = []
    for where, query in docs_queries(DOCS):
        for text, value in placeholders.items():
            query = query.replace(text, value)
        out.append((where, query))
    return out


def _cluster_only(expr: str) -> bool:
    return bool(series_of(expr) & CLUSTER_ONLY.keys())


def _all_problems(
    observed: Observed,
    queries: list[tuple[str, str]],
    check: Callable[..., list[str]] = check_query,
) -> dict[str, list[str]]:
    out = {}
    for where, expr in queries:
        if _cluster_only(expr):
            try:
                observed.prometheus.query(expr, observed.moments[0].at)
            except PromQLError as exc:
                out[f"{where}: {expr}"] = [f"refused: {exc}"]
            continue
        problems = check(observed.prometheus, expr, observed.moments)
        if problems:
            out[f"{where}: {expr}"] = problems
    return out


# --------------------------------------------------------------------------- the tests


def test_the_held_queues_are_the_servers_own(observed: Observed) -> None:
    """The anchor: one job's series are each server's own numbers, and the chart's
    queue-depth queries sum the replicas once each, the doubly scraped one too: the whole
    backlog (6 + 4 bulk, 3 + 2 interactive) and the interactive class's (3 + 2)."""
    held = observed.moments[2]
    for pod, own in zip(PODS, observed.servers_held, strict=True):
        for series, labels in (
            ("histoserve_queue_depth", {"priority": "2"}),
            ("histoserve_queue_depth", {"priority": "1"}),
            ("histoserve_inflight_requests", {}),
        ):
            extra = "".join(f', {k}="{v}"' for k, v in labels.items())
            (sample,) = observed.prometheus.query(
                f'{series}{{job="{POD_JOB}", pod="{pod}"{extra}}}', held.at
            )
            own_labels = "".join(f",{k}={v}" for k, v in labels.items())
            assert sample.value == own[f"{series}{{model=h0-mini{own_labels}}}"]
        for outcome in ("ok", "invalid"):
            (sample,) = observed.prometheus.query(
                f'histoserve_tiles_total{{job="{POD_JOB}", pod="{pod}", outcome="{outcome}"}}',
                held.at,
            )
            assert sample.value == own[f"histoserve_tiles_total{{model=h0-mini,outcome={outcome}}}"]
    queue_queries = {w: q for w, q in chart_queries() if "histoserve_queue_depth" in q}
    interactive = queue_queries.pop("keda-interactive-queue-depth.yaml")
    (sample,) = observed.prometheus.query(interactive, held.at)
    assert sample.value == sum(HELD_URGENT)
    assert queue_queries
    for query in queue_queries.values():
        (sample,) = observed.prometheus.query(query, held.at)
        assert sample.value == sum(HELD) + sum(HELD_URGENT)


def test_every_chart_query_returns_the_replicas_numbers(observed: Observed) -> None:
    queries = chart_queries()
    assert {
        "keda-queue-depth.yaml",
        "keda-interactive-queue-depth.yaml",
        "keda-gpu-utilization.yaml",
    } <= {w for w, _ in queries}
    assert _all_problems(observed, queries) == {}
    for where, query in queries:  # KEDA takes one number
        for moment in observed.moments:
            assert len(observed.prometheus.query(query, moment.at)) == 1, (where, moment.name)
    for where, query in queries:
        if "DCGM_" in query:
            namespace = TWO_GPU_NAMESPACE if "gpu.count=2" in where else NAMESPACE
            (sample,) = observed.prometheus.query(query, observed.moments[2].at)
            assert sample.value == pytest.approx(_gpu_truth(namespace)), where


def test_every_docs_query_returns_the_replicas_numbers(observed: Observed) -> None:
    queries = documented_queries()
    assert len(queries) >= 4, queries  # the cohorts guide's table, the presets' rows, ...
    assert _all_problems(observed, queries) == {}


def test_every_dashboard_panel_returns_data(observed: Observed) -> None:
    queries = dashboard_queries()
    assert _all_problems(observed, queries) == {}
    exempt = [where for where, expr in queries if _cluster_only(expr)]
    assert exempt == ["Replicas / B"], exempt  # kube-state-metrics' desired replicas, named
    dashboard = json.loads(DASHBOARD.read_text())
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = _label_values(variable["query"]["query"])
        expr = f"count by ({label}) ({fill_dashboard_variables(selector, DASHBOARD_VARIABLES)})"
        assert observed.prometheus.query(expr, observed.moments[0].at), variable["name"]
    picture = os.environ.get("HISTOSERVE_DASHBOARD_PNG")
    if picture:
        from harness.dashboard_picture import draw_dashboard

        window = (observed.moments[0].at - 5, at_now())  # the held tiles answered too
        rate = {**DASHBOARD_VARIABLES, "__rate_interval": "4s"}  # Grafana's, for a 1 s scrape
        draw_dashboard(
            dashboard, observed.prometheus, rate, window, Path(picture), shorten=f"{PREDICTOR}-"
        )


def _label_values(query: str) -> tuple[str, str]:
    """``label_values(SELECTOR, LABEL)`` (Grafana's) -> ``(SELECTOR, LABEL)``."""
    inner = query.removeprefix("label_values(").removesuffix(")")
    selector, _, label = inner.rpartition(",")
    return selector.strip(), label.strip()


def test_every_series_read_exists_from_start(observed: Observed) -> None:
    """Every series the chart, dashboard or docs read is on a server that answered nothing yet."""
    fresh = observed.moments[0].at
    names = set()
    for _, expr in chart_queries() + dashboard_queries() + documented_queries():
        names |= series_of(expr)
    names -= CLUSTER_ONLY.keys()
    assert "histoserve_queue_depth" in names and "histoserve_device_memory_bytes" in names
    absent = sorted(n for n in names if not observed.prometheus.query(f"count({n})", fresh))
    assert absent == []


BROKEN = {
    # sums the doubly scraped replica twice (the chart's warning): 6 + 6 + 4 held
    "double counted": f'sum(histoserve_queue_depth{{namespace="{NAMESPACE}"}})',
    "misspelt series": "sum(max by (pod) (histoserve_queue_dept))",
    "syntax": "sum(max by (pod) (histoserve_queue_depth)",
    "lazily created": 'sum(histoserve_tiles_total{outcome="timeout"})',
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_query_fails_the_check(observed: Observed, kind: str) -> None:
    """The check fails for each kind of broken query (else it proves nothing)."""
    assert check_query(observed.prometheus, BROKEN[kind], observed.moments)


def test_docs_queries_are_found(tmp_path: Path) -> None:
    """The extractor takes PromQL spans and leaves mentions alone (a query it missed goes unchecked)."""
    page = tmp_path / "page.md"
    page.write_text(
        "Watch `sum(max by (pod) (histoserve_queue_depth))` and "
        '`histoserve_tiles_total{outcome="ok"}`; the series `histoserve_queue_depth`, '
        "`histoserve_tiles_total{model,outcome}` and `DCGM_FI_DEV_GPU_UTIL` are mentions.\n"
    )
    assert [q for _, q in docs_queries([page])] == [
        "sum(max by (pod) (histoserve_queue_depth))",
        'histoserve_tiles_total{outcome="ok"}',
    ]


def test_one_job_holds_every_selector() -> None:
    expr = 'sum(rate(histoserve_tiles_total{outcome="ok"}[1m])) / sum(histoserve_queue_depth) + DCGM_FI_DEV_GPU_UTIL{pod=~"a.*"}'
    assert one_job(expr, {"histoserve_": "p", "DCGM_": "d"}) == (
        'sum(rate(histoserve_tiles_total{job="p", outcome="ok"}[1m])) / '
        'sum(histoserve_queue_depth{job="p"}) + DCGM_FI_DEV_GPU_UTIL{job="d", pod=~"a.*"}'
    )


def _scraped_twice(prometheus: Prometheus) -> bool:
    """Every target has two samples stored (what ``rate()`` needs)."""
    servers = "count by (job, instance) (count_over_time(histoserve_device_up[1m]) >= 2)"
    gpus = "count by (job) (count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 2)"
    return len(prometheus.query(servers)) == 3 and len(prometheus.query(gpus)) == 2


SECRET = "s3cret-token-never-logged"


def test_json_logs_name_the_request_and_never_a_credential(observed: Observed) -> None:
    """``--log_format json``: every line of a real server's log is one JSON object; a
    request's lines carry its request id, the client's trace id, the model and the
    package digest; a credential in a header or a query string is never written."""
    server, text_server = observed.servers
    body, headers = encode_request({"pixels": random_tiles(1, seed=11)})
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    traced = {
        "x-request-id": "cohort-7/slide-3",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "authorization": f"Bearer {SECRET}",
    }
    assert (
        httpx.post(url, content=body, headers={**headers, **traced}, timeout=60).status_code == 200
    )
    assert (
        httpx.post(f"{url}?token={SECRET}", content=body, headers=headers, timeout=60).status_code
        == 200
    )

    def lines() -> list[dict]:
        return [json.loads(line) for line in server.log().splitlines() if line.strip()]

    def logged() -> list[dict]:
        return [line for line in lines() if "/infer" in line["message"]][-2:]

    wait_until(lambda: len(logged()) == 2, "the two access lines")
    everything = lines()  # every line parses: json.loads raised otherwise
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in everything)
    assert SECRET not in server.log()
    first, second = logged()
    assert first["request_id"] == "cohort-7/slide-3"
    assert first["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert "trace_id" not in second and len(second["request_id"]) == 32  # made here
    for line in (first, second):
        assert line["model"] == server.model_name
        assert line["package_sha256"] == observed.package_sha256
    loaded = [line for line in everything if line["message"].startswith("serving ")]
    assert loaded and loaded[0]["package_sha256"] == observed.package_sha256
    first_text = text_server.log().splitlines()[0]  # the default stays text
    assert not first_text.startswith("{")
