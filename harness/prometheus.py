"""A real Prometheus on loopback for the tests, and the PromQL the project ships.

:func:`start_prometheus` runs Debian's ``prometheus`` binary (``make
prometheus`` installs it; the package's own service is never used) with a
config of our own and its storage in a temporary folder: scrapes every
second, answers on a free loopback port, ends with :meth:`Prometheus.stop`.
:meth:`Prometheus.query` is the HTTP API's instant query at a chosen time,
so a test can evaluate everything at one moment, after the fact.

The rest finds the queries: the chart's rendered KEDA queries, the
dashboard's panel targets and the inline PromQL of the docs
(:func:`docs_queries`), and rewrites them: Grafana's template variables
filled in (:func:`fill_dashboard_variables`) and every selector held to one
scrape job (:func:`one_job`), which is what one replica's own numbers are.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.server import free_port
from harness.waiting import wait_until

DEBIAN_BINARY = Path("/usr/bin/prometheus")
SCRAPE_INTERVAL_S = 1
SERIES_PREFIXES = ("histoserve_", "DCGM_", "kube_")
"""Where a query's series come from: histoserve, NVIDIA's dcgm-exporter, kube-state-metrics."""
_SERIES = re.compile(r"\b((?:histoserve|DCGM|kube)_[A-Za-z0-9_]+)\b(\{[^}]*\})?")
_CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_MATCHER = re.compile(r"\{[^}]*(=|=~|!=|!~)\s*\"")


class PromQLError(RuntimeError):
    """Prometheus refused a query (its ``error`` text, with the query)."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector (or a scalar, with no labels)."""

    labels: Mapping[str, str]
    value: float


def find_prometheus() -> str | None:
    """Debian's binary, else ``prometheus`` on PATH; None when neither."""
    if DEBIAN_BINARY.exists():
        return str(DEBIAN_BINARY)
    return shutil.which("prometheus")


class Prometheus:
    """A running Prometheus; its HTTP API at :attr:`url`."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:  # 400/422: a query Prometheus refuses
            body = json.load(exc)
        if body.get("status") != "success":
            raise PromQLError(f"{params.get('query')!r}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """``expr`` evaluated at ``at`` (Unix seconds; now when None): its series."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise PromQLError(f"{expr!r}: a {data['resultType']}, not an instant vector")
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[Mapping[str, str], list[tuple[float, float]]]]:
        """``expr`` from ``start`` to ``end`` every ``step_s``: each series' points."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step_s)}
        data = self._get("/api/v1/query_range", params)
        return [
            (r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
        ]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start_prometheus(binary: str, scrape_configs: list[dict[str, Any]], folder: Path) -> Prometheus:
    """Runs ``binary`` scraping ``scrape_configs`` every second, storage under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "scrape_configs": scrape_configs,
    }
    config_path = folder / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = folder / "prometheus.log"
    args = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    prometheus = Prometheus(proc, port, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {proc.returncode}: {prometheus.tail()}")
        return prometheus.ready()

    wait_until(up, "prometheus ready", detail=prometheus.tail)
    return prometheus


# --------------------------------------------------------------------------- the queries


def docs_queries(paths: Iterable[Path]) -> Iterator[tuple[str, str]]:
    """``(where, query)`` for each inline code span of ``paths`` that is PromQL.

    A span is PromQL when it names a series (``histoserve_*``, ``DCGM_*``,
    ``kube_*``) and either calls something (``(``) or matches a label
    (``{name="..."}``); a bare series name or a list of label names
    (``histoserve_tiles_total{model,outcome}``) is a mention, not a query.
    """
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for span in _CODE_SPAN.findall(line):
                if _SERIES.search(span) and ("(" in span or _MATCHER.search(span)):
                    yield f"{path.name}:{number}", span


def dashboard_targets(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(panel title / refId, expr)`` of every panel's every target (rows' panels too)."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                if target.get("expr"):
                    yield f"{inner['title']} / {target['refId']}", target["expr"]


def fill_dashboard_variables(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with Grafana's ``$name`` / ``${name}`` / ``[[name]]`` replaced from ``values``.

    Raises:
        KeyError: A variable ``values`` has no value for.
    """

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


def one_job(expr: str, jobs: Mapping[str, str]) -> str:
    """``expr`` with ``job="..."`` added to every selector of a series, the job by the
    series' prefix (``{"histoserve_": "ns/pods", "DCGM_": "dcgm"}``; others untouched)."""

    def held(match: re.Match[str]) -> str:
        name, braces = match.group(1), match.group(2)
        job = next((j for prefix, j in jobs.items() if name.startswith(prefix)), None)
        if job is None:
            return match.group(0)
        if braces is None:
            return f'{name}{{job="{job}"}}'
        inner = braces[1:-1].strip()
        return f'{name}{{job="{job}"{", " if inner else ""}{inner}}}'

    return _SERIES.sub(held, expr)


def series_of(expr: str) -> set[str]:
    """The series names ``expr`` reads (its histoserve/DCGM/kube ones)."""
    return {m.group(1) for m in _SERIES.finditer(expr)}


def same(a: float, b: float, rel: float) -> bool:
    """Equal within ``rel`` (relative; NaN equals NaN, as two empty ratios are)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def at_now() -> float:
    """Now, in the Unix seconds Prometheus's API takes."""
    return time.time()
