"""``python -m bench.studies.client_http``: the client's HTTP path, before and after its one core, side by side.

One demo server; two client versions, each in its own process, sending the
same requests (``batch`` raw tiles, ``embedding`` mode, through the
dispatcher and the answer check, as ``histoserve embed`` does): this
checkout's ``histoserve/`` and the one at :data:`BEFORE` (extracted from
git history by :func:`bench.servers.before.source_tree`, same virtual environment).
Rounds alternate (before, after, before, ...); reported per version: client
CPU ms per tile (the client process's own CPU) and tiles/s, and the ratio.
Figures on a busy machine are noise; the ratio of interleaved rounds is what
to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.servers.before import source_tree
from harness.packages import demo_package
from harness.server import REPO

BEFORE = "f6da6eb"
"""The client before the one network core (whole-request deadline, bounded answers)."""

_LOOP = """
import json, sys, time
import numpy as np
from histoserve.remote.answers import AnswerCheck
from histoserve.remote.dispatch import Dispatcher, RetryPolicy
from histoserve.remote.transport import RecyclePolicy
url, requests, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:  # the tree before the one client core
    from histoserve.remote.served_model import fetch_server_info
    info = fetch_server_info([url], None)
except ImportError:
    from histoserve.remote.client import HistoserveClient
    with HistoserveClient(url) as client:
        info = client.info
check = AnswerCheck.for_mode(info, "embedding")
tiles = np.random.default_rng(0).integers(0, 255, (batch, info.tile_size, info.tile_size, 3), np.uint8)
with Dispatcher.from_urls([url], 60.0, RetryPolicy(), RecyclePolicy()) as d:
    for _ in range(5):
        d.infer(info.model, {"pixels": tiles}, {"mode": "embedding"}, check=check)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        d.infer(info.model, {"pixels": tiles}, {"mode": "embedding"}, check=check)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "tiles": requests * batch}))
"""


def _round(tree: Path, url: str, requests: int, batch: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _LOOP, url, str(requests), str(batch)],
        capture_output=True, text=True, check=True, env=env, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(rounds: int = 3, requests: int = 100, batch: int = 32) -> dict[str, dict[str, float]]:
    """Per version (``before``, ``after``): median client CPU ms per tile and tiles/s."""
    from harness.server import start_server

    trees = {"before": source_tree(BEFORE, "histoserve"), "after": REPO}
    package = demo_package("h0-mini")
    logs = Path(tempfile.mkdtemp(prefix="client-http-"))
    server = start_server(package.parent, logs, "--checkpoint", package.name)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for _ in range(rounds):
            for name, tree in trees.items():
                runs[name].append(_round(tree, server.base, requests, batch))
    finally:
        server.stop()
    return {
        name: {
            "cpu_ms_per_tile": statistics.median(1e3 * r["cpu_s"] / r["tiles"] for r in rs),
            "tiles_per_s": statistics.median(r["tiles"] / r["wall_s"] for r in rs),
        }
        for name, rs in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Prints the two versions' figures and their ratios as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.client_http", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    figures = measure(args.rounds, args.requests, args.batch)
    before, after = figures["before"], figures["after"]
    figures["ratio_after_over_before"] = {k: after[k] / before[k] for k in before}
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
