"""The benchmark harness runs end to end on a tiny configuration.

Not a timed test: it checks that ``python -m bench.run --profile tiny`` starts
the three servers, drives every protocol, and writes JSON, Markdown and a plot
with sane fields. Absolute numbers are not asserted (shared, noisy machines).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.load.payloads import PROTOCOLS

REPO = Path(__file__).resolve().parents[2]

# Two minutes of benchmark on 2 cores (three servers, Triton, every protocol): `make test-long`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--profile", "tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.integration
def test_outputs_exist(tiny_results: tuple[Path, dict]) -> None:
    out, results = tiny_results
    markdown = (out / "results.md").read_text()
    assert markdown.startswith("# histoserve benchmark results")
    assert "## Targets" in markdown and "## Stage 1" in markdown
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["meta"]["cores"] >= 1 and results["meta"]["duration_s"] > 0


@pytest.mark.integration
def test_limit_and_cells_are_sane(tiny_results: tuple[Path, dict]) -> None:
    model = tiny_results[1]["models"]["demo"]
    assert all(row["tiles_per_s"] > 0 for row in model["limit"].values())
    ran = [c for c in model["cells"] + model["baselines"] if "throughput" in c]
    assert {c["protocol"] for c in ran} == set(PROTOCOLS)
    assert {c["server"] for c in ran} == {"histoserve", "nobatch", "naive"}
    for cell in ran:
        assert cell["throughput"] > 0 and cell["requests"] > 0, cell
        assert not cell["errors"], cell
        assert cell["p50_ms"] <= cell["p99_ms"]
        assert cell["efficiency"] > 0
        assert cell["output_shape"] == [cell["tiles"], 1536]
    assert all(c["mean_batch"] >= 1 for c in ran if c["server"] != "naive")


@pytest.mark.integration
def test_ratios_are_computed(tiny_results: tuple[Path, dict]) -> None:
    results = tiny_results[1]
    targets = results["models"]["demo"]["targets"]
    assert targets["efficiency"]["efficiency"] > 0
    assert targets["many_clients"]["vs_naive"] > 0
    assert targets["many_clients"]["vs_nobatch"] > 0
    idle = results["models"]["demo"]["idle_latency"]
    assert idle["forward_ms"] > 0
    assert all(idle[s]["median_ms"] > 0 for s in ("histoserve", "nobatch", "naive"))
    stage1 = results["stage1"]
    assert all(stage1["formats"][f]["per_thread_us"] > 0 for f in ("pixels", "png", "jpeg"))
    assert stage1["naive_decode_us"] > 0 and stage1["naive_normalise_us"] > 0


@pytest.mark.integration
def test_triton_ran_beside_histoserve(tiny_results: tuple[Path, dict]) -> None:
    from bench.triton import baseline

    part = tiny_results[1]["models"]["demo"]["triton"]
    if not baseline.available():  # `make bench` creates .venv-triton; the results say so
        assert part["skipped"] == ".venv-triton is missing (`make bench` creates it)"
        return
    assert "skipped" not in part, part.get("skipped")
    for server in ("histoserve", "triton"):
        assert all(r["ok"] for r in part["check"][server].values()), part["check"]
        assert set(part["check"][server]) == {"v2-pixels", "v2-grpc"}
    assert {(c["server"], c["protocol"]) for c in part["cells"]} == {
        (s, p) for s in ("histoserve", "triton") for p in ("v2-pixels", "v2-grpc")
    }
    for cell in part["cells"]:
        assert cell["throughput"] > 0 and not cell["errors"], cell
        assert cell["output_shape"] == [cell["tiles"], 1536]
    triton_cells = [c for c in part["cells"] if c["server"] == "triton"]
    assert all(c["mean_batch"] >= 1 and c["server_cores"] > 0 for c in triton_cells)
    assert all(p["throughput_ratio"] > 0 for p in part["pairs"])
    assert (
        part["unfair"] and "Triton not measured" not in (tiny_results[0] / "results.md").read_text()
    )


@pytest.mark.integration
def test_null_model_rate_and_cpu_per_request(tiny_results: tuple[Path, dict]) -> None:
    from bench.triton import baseline

    part = tiny_results[1]["null_model"]
    servers = {"histoserve", "triton"} if baseline.available() else {"histoserve"}
    assert {(c["server"], c["protocol"]) for c in part["cells"]} == {
        (s, p) for s in servers for p in ("v2-pixels", "v2-grpc")
    }
    for cell in part["cells"]:
        assert cell["requests_per_s"] > 0 and not cell["errors"], cell
        assert cell["cpu_ms_per_request"] > 0, cell
    assert "## Null model" in (tiny_results[0] / "results.md").read_text()


@pytest.mark.integration
def test_cold_start_stage_ran_last_on_the_demo_package(tiny_results: tuple[Path, dict]) -> None:
    part = tiny_results[1]["coldstart"]
    assert list(part) == ["demo"]
    starts = part["demo"]["starts"]
    assert starts["warm"]["runs"] == 1 and starts["warm"]["total"] > starts["warm"]["imports"] > 0
    assert "## Cold start: process start to ready" in (tiny_results[0] / "results.md").read_text()


@pytest.mark.integration
def test_front_ends_and_defaults_stages_ran(tiny_results: tuple[Path, dict]) -> None:
    from bench.stages.crossing import PACED_PROTOCOLS
    from bench.stages.frontends import PROTOCOLS as FE_PROTOCOLS
    from bench.stages.frontends import TRITON_PROTOCOLS
    from bench.triton import baseline

    fe = tiny_results[1]["frontends"]
    served = {("histoserve", p) for p in FE_PROTOCOLS}
    served |= {("histoserve --frontends 2", p) for p in FE_PROTOCOLS}
    if baseline.available():
        served |= {("triton", p) for p in TRITON_PROTOCOLS}
    assert {(c["server"], c["protocol"]) for c in fe["cells"]} == served
    for cell in fe["cells"]:
        assert cell["requests_per_s"] > 0 and not cell["errors"], cell
        assert cell["cpu_ms_per_request"] > 0 and cell["output_shape"] == [1, 1536], cell
    assert {t["target"] for t in fe["targets"]} >= {
        "N front ends vs one, binary REST",
        "V2 JSON JPEG CPU per request vs V1's",
    }
    assert all(t["ratio"] > 0 and isinstance(t["met"], bool) for t in fe["targets"])
    crossed = fe["crossing"]
    assert {(c["server"], c["protocol"]) for c in crossed["paced"]} == {
        (s, p) for s in ("histoserve", "histoserve --frontends 2") for p in PACED_PROTOCOLS
    }
    assert all(c["cpu_ms_per_request"] > 0 and not c["errors"] for c in crossed["paced"])
    assert len(crossed["ratios"]) == len(PACED_PROTOCOLS)
    assert {t["target"] for t in crossed["ratios"]} <= {t["target"] for t in fe["targets"]}
    for cell in crossed["ceiling"]:
        assert cell["output_shape"] == [32, 1536] and not cell["errors"], cell
        assert cell["tiles_per_s_per_core"] > 0 and cell["cores_for_gpu"] > 0, cell
    demo = tiny_results[1]["defaults"]
    assert {(c["protocol"], c["concurrency"], c["tiles"]) for c in demo["cells"]} == {
        ("v2-pixels", 64, 1), ("v2-grpc", 64, 1), ("v2-pixels", 16, 32)
    }  # fmt: skip
    assert all(c["throughput"] > 0 and not c["errors"] for c in demo["cells"])
    of_limit = [t for t in demo["targets"] if "limit" in t["target"]]
    assert len(of_limit) == 1 and of_limit[0]["limit_tps"] > 0
    markdown = (tiny_results[0] / "results.md").read_text()
    assert "## Null model at each server's defaults" in markdown
    assert "### One process's batched ceiling" in markdown
    assert "## Demo package, each server at its defaults" in markdown


@pytest.mark.integration
def test_slide_reading_stage_ran_every_path(tiny_results: tuple[Path, dict]) -> None:
    from bench.stages.jpeg_transport import PATHS

    rows = tiny_results[1]["slide_reading"]["rows"]
    paths = {(r["reader"], r["resize"], r["transport"]) for r in rows if r["slide"] == "A"}
    assert paths == set(PATHS)
    assert {r["slide"] for r in rows} == {"A", "B"}
    assert (tiny_results[0] / "slide_reading.json").exists()
    assert (
        "## Slide reading and transport (issue 35)" in (tiny_results[0] / "results.md").read_text()
    )
