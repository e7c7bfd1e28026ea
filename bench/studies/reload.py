"""``python -m bench.studies.reload``: one model at full load while another is loaded and unloaded.

Issue 51: "load/unload of one model while others serve at full load: their
p99 within 2x of without". One server, ``--model_control explicit --models a``,
``--model_dir`` of two folders:

* ``a``: the demo ``h0-mini`` encoder, served throughout to ``--clients``
  closed-loop clients sending ``--tiles``-tile V2 binary REST requests back to
  back (:mod:`bench.load.generator`, its own process): the device saturated;
* ``b``: the demo ``tissue-seg`` segmenter (the model a lab loads beside its
  encoder), its folder's ``histoserve.json`` setting ``load_probe``
  (``--b-probe``): ``auto``, the default, probes only a package's first load
  on a host (the untimed warm-up load here), so every timed load is a reload;
  ``on`` makes every load pay the load probe's child process (``import
  torch``, the load, one batch: seconds of CPU), the worst case.

Phases alternate (``steady, churn, churn, steady`` per two rounds) over
``--rounds``, each ``--window-s`` measured seconds after a warm-up: in a
*steady* phase nothing else happens; in a *churn* phase a thread here loads
``b`` and unloads it through the repository API (``POST
/v2/repository/models/b/load``, then ``/unload``), one after the other, for
the whole phase. Per phase: ``a``'s tiles/s, p50/p99 and errors (must be
none), the loads and unloads done and their seconds, and the cores used by the
server, the clients and everything else. The figure is ``a``'s p99 in churn
over its p99 in steady (issue 51's target: at most 2), per pair of adjacent
phases and over all of them. Beside it, the event loop's responsiveness:
``GET /v2/health/live`` every 100 ms through each phase (p99 and max), and
from the server's log the median seconds of each step of ``b``'s loads
(digest, metadata, extraction, load, the load probe's child, the family's
check, warm-up): where a load's time goes. With ``--py-spy PATH`` each
server is sampled in one more churn phase before the timed ones (``py-spy record`` at 100 Hz:
first only where a thread holds the GIL, then every thread not idle), the
most sampled frames kept: what the serving model waits for.

With ``--server-cpus LIST`` each server (its threads and the load probe's
child) runs on those cores only (``taskset``): on this shared 2-core machine
other people's jobs otherwise take most of the second core, and what the
load takes from the serving model is lost in their noise; on one core the
load competes with the serving model alone, as in a pod with a one-core
limit. With ``--before COMMIT`` the server at that commit (only ``predictor/``
differs, :mod:`bench.servers.before`) runs beside this checkout's, both
started at once, and each round runs both arms' phases, the arms' order
alternating: a before-and-after from one stretch of time.

One torch thread (``OMP_NUM_THREADS=1``), one device worker per model, CPU.
JSON with ``--out`` (the machine, the commit); a Markdown table on stdout. A
few minutes; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.markdown import number, table

PHASES = ("steady", "churn")
TARGET_P99_RATIO = 2.0
"""Issue 51: the serving model's p99 while another loads and unloads, over its p99 without."""


THIS = "this checkout"


def phase_order(rounds: int, arms: tuple[str, ...] = (THIS,)) -> list[tuple[str, str]]:
    """``(arm, phase)`` in run order: per round each arm's ``steady`` and ``churn``, the
    phases' order and the arms' order alternating between rounds (a trend over the run
    weighs on both), so each arm's phases come in adjacent pairs."""
    order: list[tuple[str, str]] = []
    for r in range(rounds):
        kinds = PHASES if r % 2 == 0 else PHASES[::-1]
        for arm in arms if r % 2 == 0 else arms[::-1]:
            order += [(arm, kind) for kind in kinds]
    return order


def _model_dir(root: Path, args: argparse.Namespace) -> Path:
    from harness.packages import copy_package_dir, demo_package

    model_dir = root / "models"
    for name, spec, batch in (("a", "h0-mini", args.batch), ("b", "tissue-seg", 8)):
        copy_package_dir(demo_package(spec), model_dir / name)
        settings = {
            "max_batch_size": batch,
            "max_latency_ms": 5,
            "max_queue_size": 1024,
            "instances_per_device": 1,
            "load_probe": args.b_probe if name == "b" else "auto",
        }
        (model_dir / name / "histoserve.json").write_text(json.dumps(settings))
    return model_dir


def _start(
    model_dir: Path,
    root: Path,
    extra: tuple[str, ...],
    source: Path | None,
    cpus: str | None,
) -> Any:
    from bench.servers.launch import bench_env
    from harness.server import free_port, predictor_command, spawn

    ports = (free_port(), free_port())
    args = predictor_command(
        model_dir, ports, "--device", "cpu", "--preprocess_workers", "2",
        "--model_control", "explicit", "--models", "a", "--drain_timeout_s", "10", *extra,
    )  # fmt: skip
    if cpus:  # the server, its threads and the load probe's child on these cores only
        args = ["taskset", "-c", cpus, *args]
    env = bench_env(1)
    kind = "before" if source else "histoserve"
    env["XDG_CACHE_HOME"] = str(root / f"cache-{kind}")  # a fresh load-probe record
    return spawn(
        args, ports=ports, log_dir=root / "logs", model_name="a", env=env, kind=kind, cwd=source
    )


class Churn:
    """Loads and unloads model ``b`` through the repository API until stopped.

    Each call's outcome and seconds are kept; a refused or failed call is
    recorded (with its body) and the loop goes on.
    """

    def __init__(self, base: str, model: str = "b"):
        self._base, self._model = base, model
        self._stop = threading.Event()
        self.calls: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Starts the loop in its thread."""
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        """Ends the loop after its current call; leaves ``b`` unloaded; the calls made."""
        self._stop.set()
        self._thread.join(300)
        self.call("unload")
        return self.calls

    def call(self, verb: str) -> None:
        import httpx

        url = f"{self._base}/v2/repository/models/{self._model}/{verb}"
        started = time.monotonic()
        try:
            response = httpx.post(url, timeout=300)
            status, body = response.status_code, response.text[:300]
        except httpx.HTTPError as exc:
            status, body = 0, f"{type(exc).__name__}: {exc}"
        self.calls.append(
            {
                "verb": verb,
                "status": status,
                "seconds": time.monotonic() - started,
                "ended": time.monotonic(),
                **({"body": body} if status != 200 else {}),
            }
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.call("load")
            if self._stop.is_set():
                break
            self.call("unload")


class LoopProbe:
    """``GET /v2/health/live`` every ``interval_s`` until stopped: the event loop's
    responsiveness (a load holding the GIL or the cores shows as its latency)."""

    def __init__(self, base: str, interval_s: float = 0.1):
        self._url, self._interval_s = f"{base}/v2/health/live", interval_s
        self._stop = threading.Event()
        self.latencies_s: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Starts polling in its thread."""
        self._thread.start()

    def stop(self) -> dict[str, float | None]:
        """Ends polling; p50, p99 and max latency in ms."""
        self._stop.set()
        self._thread.join(60)
        return latency_ms(self.latencies_s)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self._stop.wait(self._interval_s):
                started = time.monotonic()
                try:
                    client.get(self._url)
                except httpx.HTTPError:
                    continue
                self.latencies_s.append(time.monotonic() - started)


def latency_ms(values_s: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``values_s`` in ms (None when empty)."""
    if not values_s:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values_s)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(1000 * ordered[-1], 1)}


_PHASES_LINE = re.compile(r"/models/b/.*start-up phases: (.*)$")
_PHASE = re.compile(r"(\w+) ([0-9.]+)s")


def load_phases(log: str) -> dict[str, float]:
    """Median seconds of each start-up phase over ``b``'s loads in a server log
    (``loaded ... models/b/...; start-up phases: digest 0.003s, ...``)."""
    seen: dict[str, list[float]] = {}
    for line in log.splitlines():
        found = _PHASES_LINE.search(line)
        for name, value in _PHASE.findall(found.group(1)) if found else ():
            seen.setdefault(name, []).append(float(value))
    return {name: round(statistics.median(v), 3) for name, v in seen.items()}


def py_spy_profile(py_spy: str, pid: int, seconds: float, gil: bool) -> dict[str, Any]:
    """``py-spy record`` of ``pid`` for ``seconds`` at 100 Hz: samples per thread and the
    most sampled innermost three frames. With ``gil``, only samples where a thread
    holds the GIL (their count over ``100 * seconds`` is the GIL's busy share);
    without, every thread not idle (running or waiting for a core)."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.txt"
        cmd = [py_spy, "record", "--threads", "--nonblocking", "-r", "100", "-d",
               str(int(seconds)), "-f", "raw", "-o", str(out), "--pid", str(pid)]  # fmt: skip
        done = subprocess.run(
            [*cmd, "--gil"] if gil else cmd, capture_output=True, text=True, timeout=seconds + 60
        )
        if not out.is_file():
            return {"failed": done.stderr[-500:]}
        return summarise_raw(out.read_text(), 100 * int(seconds))


def summarise_raw(raw: str, possible: int) -> dict[str, Any]:
    """py-spy's ``raw`` output (``thread (tid): name;frame (file:line);... count``) summed."""
    total = 0
    frames: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        inner = ";".join(part.split(" (")[0] for part in stack.split(";")[1:][-3:])
        frames[inner] = frames.get(inner, 0) + n
    top = sorted(frames.items(), key=lambda kv: -kv[1])[:15]
    return {"samples": total, "possible": possible, "top_frames": dict(top)}


def _job(server: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "protocol": "v2-pixels",
        "concurrency": args.clients,
        "tiles": args.tiles,
        "model": "a",
        "http": server.http_url,
        "grpc": server.grpc_url,
        "tile_size": 224,
        "warmup_s": args.warmup_s,
        "window_s": args.window_s,
        "drain_s": 60.0,
        "max_requests": 1_000_000,
        "timeout_s": 120.0,
        "server_pid": server.pid,
        "metrics": True,
    }


def run_phase(
    client: Any, server: Any, kind: str, args: argparse.Namespace, profile: bool = False
) -> dict[str, Any]:
    """One phase: ``a``'s load generator for a warm-up and a window, with or without churn;
    with ``profile``, py-spy samples the server in the window (GIL, then every thread)."""
    churn = Churn(server.base) if kind == "churn" else None
    loop = LoopProbe(server.base)
    loop.start()
    if churn:
        churn.start()
    profiled: dict[str, Any] = {}
    if profile:
        span = max(1.0, (args.window_s - 1) / 2)

        def sample() -> None:
            time.sleep(args.warmup_s + 0.5)
            for gil in (True, False):
                key = "gil" if gil else "cpu"
                profiled[key] = py_spy_profile(args.py_spy, server.pid, span, gil)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    result = client.run(_job(server, args))
    if profile:
        sampler.join(args.window_s + 120)
    calls = churn.stop() if churn else []
    health = loop.stop()
    if "failed" in result:
        raise RuntimeError(f"{kind}: the load generator failed: {result['failed']}")
    cores = {
        "server": result.get("server_cores"),
        "clients": result.get("client_cores"),
        "other": result.get("other_cores"),
    }
    return {
        "phase": kind,
        "tiles_per_s": result["throughput"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "requests": result["requests"],
        "errors": result["errors"],
        "forward_busy": result.get("forward_busy"),
        "health_ms": health,
        "cores": cores,
        **({"py_spy": profiled} if profiled else {}),
        "calls": calls,
    }


def _median_of(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def summarise(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """``a``'s figures per kind of phase and the p99 ratio (churn over steady).

    Each phase is ``{"phase", "tiles_per_s", "p99_ms", "errors": {status: n},
    "calls": [{"verb", "status", "seconds"}]}``. The ratio is of the medians of
    the phases' p99s; ``pair_ratios`` compares each churn phase with the steady
    phase run next to it (the order :func:`phase_order` makes), so the spread shows.
    """
    out: dict[str, Any] = {}
    for kind in PHASES:
        mine = [p for p in phases if p["phase"] == kind]
        calls = [c for p in mine for c in p["calls"]]
        loads = [c["seconds"] for c in calls if c["verb"] == "load" and c["status"] == 200]
        unloads = [c["seconds"] for c in calls if c["verb"] == "unload" and c["status"] == 200]
        out[kind] = {
            "phases": len(mine),
            "tiles_per_s": round(statistics.fmean(p["tiles_per_s"] for p in mine), 1),
            "p50_ms": round(statistics.median(p["p50_ms"] for p in mine), 1),
            "p99_ms": round(statistics.median(p["p99_ms"] for p in mine), 1),
            "p99_ms_each": [round(p["p99_ms"], 1) for p in mine],
            "errors": sum(sum(p["errors"].values()) for p in mine),
            "loads": len(loads),
            "unloads": len(unloads),
            "calls_failed": sum(1 for c in calls if c["status"] != 200),
            "load_s_median": round(statistics.median(loads), 2) if loads else None,
            "health_p99_ms": _median_of(p.get("health_ms", {}).get("p99_ms") for p in mine),
            "health_max_ms": max(
                (p["health_ms"]["max_ms"] for p in mine if p.get("health_ms", {}).get("max_ms")),
                default=None,
            ),
            "unload_s_median": round(statistics.median(unloads), 2) if unloads else None,
        }
    pairs = [phases[i : i + 2] for i in range(0, len(phases) - 1, 2)]
    out["pair_ratios"] = [
        round(next(p["p99_ms"] for p in pair if p["phase"] == "churn")
              / next(p["p99_ms"] for p in pair if p["phase"] == "steady"), 2)
        for pair in pairs
        if {p["phase"] for p in pair} == set(PHASES)
    ]  # fmt: skip
    out["p99_ratio"] = round(out["churn"]["p99_ms"] / out["steady"]["p99_ms"], 2)
    out["tiles_per_s_ratio"] = round(out["churn"]["tiles_per_s"] / out["steady"]["tiles_per_s"], 2)
    out["target_met"] = (
        out["p99_ratio"] <= TARGET_P99_RATIO
        and out["churn"]["errors"] == 0
        and out["steady"]["errors"] == 0
        and out["churn"]["loads"] > 0
    )
    return out


def markdown(summary: dict[str, Any]) -> str:
    """The summary as one Markdown table."""
    head = [
        "phase", "a tiles/s", "a p50 ms", "a p99 ms (each phase)", "a errors",
        "b loads / unloads", "load s / unload s (median)", "health p99 / max ms",
    ]  # fmt: skip
    body = []
    for kind in PHASES:
        s = summary[kind]
        each = ", ".join(number(v, 0) for v in s["p99_ms_each"])
        body.append(
            [kind, number(s["tiles_per_s"]), number(s["p50_ms"], 0),
             f"{number(s['p99_ms'], 0)} ({each})", str(s["errors"]),
             f"{s['loads']} / {s['unloads']}",
             f"{number(s['load_s_median'], 2)} / {number(s['unload_s_median'], 2)}",
             f"{number(s['health_p99_ms'], 0)} / {number(s['health_max_ms'], 0)}"]
        )  # fmt: skip
    ratios = ", ".join(number(v, 2) for v in summary["pair_ratios"])
    lines = table(head, body)
    lines.append("")
    lines.append(
        f"p99 churn / steady: {number(summary['p99_ratio'], 2)} (pairs: {ratios}); "
        f"target <= {TARGET_P99_RATIO}: {'met' if summary['target_met'] else 'missed'}"
    )
    return "\n".join(lines)


def measure(args: argparse.Namespace, root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Starts the server(s), loads and unloads ``b`` once on each, profiles one churn phase
    each (``--py-spy``), runs :func:`phase_order`; the phases, and what the logs and
    profiles say."""
    from bench.matrix.cells import LoadClient

    model_dir = _model_dir(root, args)
    sources: dict[str, Path | None] = {THIS: None}
    if args.before:
        from bench.servers.before import source_tree

        sources[f"before ({args.before})"] = source_tree(args.before)
    extra = tuple(args.server_flag)
    servers = {
        arm: _start(model_dir, root, extra, src, args.server_cpus) for arm, src in sources.items()
    }
    client = None
    profiles: dict[str, Any] = {}
    try:
        for arm, server in servers.items():
            server.wait_ready()
            warm = Churn(server.base)  # one load and unload of b before anything is timed
            warm.call("load")
            warm.call("unload")
            if any(c["status"] != 200 for c in warm.calls):
                raise RuntimeError(
                    f"{arm}: b does not load and unload: {warm.calls}\n{server.tail()}"
                )
            print(json.dumps({"arm": arm, "warm-up": warm.calls}), flush=True)
        client = LoadClient()
        phases = []
        for arm in servers if args.py_spy else ():  # an extra churn phase each, not timed
            profiled = run_phase(client, servers[arm], "churn", args, profile=True)
            profiles[arm] = {k: profiled[k] for k in ("py_spy", "tiles_per_s", "p99_ms")}
        for arm, kind in phase_order(args.rounds, tuple(servers)):
            phases.append({"arm": arm, **run_phase(client, servers[arm], kind, args)})
            p = phases[-1]
            print(json.dumps({k: p[k] for k in ("arm", "phase", "tiles_per_s", "p99_ms", "errors")}
                             | {"calls": len(p["calls"]), "cores": p["cores"]}), flush=True)  # fmt: skip
    finally:
        if client:
            client.close()
        for server in servers.values():
            server.stop()
    steps = {arm: load_phases(server.log()) for arm, server in servers.items()}
    return phases, {"load_steps_s_median": steps, "py_spy_churn": profiles}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.reload", description=__doc__)
    parser.add_argument("--clients", type=int, default=8, help="a's closed-loop clients")
    parser.add_argument("--tiles", type=int, default=16, help="tiles per request to a")
    parser.add_argument("--batch", type=int, default=32, help="a's max_batch_size")
    parser.add_argument("--b-probe", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of phases")
    parser.add_argument(
        "--server-flag", action="append", default=[], help="one more server flag (repeat)"
    )
    parser.add_argument("--before", default=None, help="also run the server at this commit")
    parser.add_argument(
        "--server-cpus",
        default=None,
        help="the servers' cores (taskset -c LIST), e.g. 1: serving and loading share one "
        "core, as in a pod limited to one; default: every core",
    )
    parser.add_argument(
        "--py-spy",
        default=None,
        help="py-spy's path: sample each server in its first churn phase (who holds the GIL, "
        "then where every thread is)",
    )
    parser.add_argument("--machine", default="", help="what the run ran on, for the record")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    from bench.servers.before import checkout_commit
    from bench.studies.jpeg_flood import _machine

    machine = _machine()
    if args.machine:
        machine["note"] = args.machine
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="reload-"))
    try:
        phases, found = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    arms = list(dict.fromkeys(p["arm"] for p in phases))
    summary = {arm: summarise([p for p in phases if p["arm"] == arm]) for arm in arms}
    record = {
        "made_by": "python -m bench.studies.reload",
        "commit": checkout_commit(),
        "machine": machine,
        "settings": {**vars(args), "out": None, "a": "demo h0-mini", "b": "demo tissue-seg"},
        "seconds": round(time.monotonic() - started, 1),
        "target_p99_ratio": TARGET_P99_RATIO,
        "summary": summary,
        **found,
        "phases": phases,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    for arm in arms:
        print(f"\n{arm}:\n{markdown(summary[arm])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
