"""Pure helpers of the benchmark harness: no server, no package."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from bench.load.payloads import build_payload, rest_output_rows, synthetic_tiles
from bench.load.probes import Snapshot, parse_metrics, summarise_window
from bench.matrix.cells import Cell, skip_reason, timing
from bench.matrix.limit import limit_at
from bench.profiles import PROFILES, ModelCase, Windows
from histoserve.wire import HEADER


def test_limit_at_interpolates_and_clamps() -> None:
    table = {"1": {"tiles_per_s": 10.0}, "4": {"tiles_per_s": 40.0}}
    assert limit_at(table, 1) == 10.0
    assert limit_at(table, 2.5) == pytest.approx(25.0)
    assert limit_at(table, 64) == 40.0
    assert limit_at(table, 0.5) == 10.0


def test_parse_metrics_sums_label_sets() -> None:
    text = (
        "# HELP histoserve_batch_size x\n"
        'histoserve_batch_size_sum{model="a"} 12.0\n'
        'histoserve_batch_size_count{model="a"} 3.0\n'
        'histoserve_batch_size_count{model="b"} 1.0\n'
        'histoserve_batch_size_bucket{model="a",le="1.0"} 1.0\n'
    )
    assert parse_metrics(text) == {
        "histoserve_batch_size_sum": 12.0,
        "histoserve_batch_size_count": 4.0,
    }


def test_summarise_window_splits_time_and_cpu() -> None:
    a = Snapshot(at=0.0, metrics={}, server_cpu_s=1.0, client_cpu_s=0.5, busy_s=10.0)
    b = Snapshot(
        at=2.0,
        metrics={
            "histoserve_batch_size_sum": 64.0,
            "histoserve_batch_size_count": 4.0,
            "histoserve_forward_seconds_sum": 1.0,
        },
        server_cpu_s=2.0,
        client_cpu_s=0.7,
        busy_s=13.0,
    )
    out = summarise_window(a, b)
    assert out["mean_batch"] == 16.0
    assert out["forward_busy"] == 0.5
    assert out["forward_ms_per_batch"] == 250.0
    assert out["server_cores"] == 0.5 and out["client_cores"] == pytest.approx(0.1)
    assert out["other_cores"] == pytest.approx(0.9)


def test_windows_scale_with_rounds_and_skip_big_cells() -> None:
    windows = Windows()
    case = ModelCase("m", "h0-mini", "tiny", max_inflight_tiles=128)
    fast = timing(Cell("histoserve", "v1", 1, 1), 1000.0, windows)
    assert fast["window_s"] == windows.window_min_s
    slow = timing(Cell("histoserve", "v1", 64, 32), 10.0, windows)
    assert slow["window_s"] == windows.window_max_s
    assert skip_reason(Cell("histoserve", "v1", 64, 32), case, 10.0)
    assert skip_reason(Cell("histoserve", "v1", 64, 32, target=True), case, 10.0) is None
    target = timing(Cell("histoserve", "v1", 16, 32, target=True), 10.0, windows)
    assert target["window_s"] == windows.target_max_s


def test_profiles_cover_the_issue_matrix() -> None:
    full = PROFILES["full"]
    assert full.concurrencies == (1, 4, 16, 64) and full.tile_counts == (1, 32)
    assert {m.label for m in full.models} == {"demo", "vit-s"}
    assert PROFILES["gpu"].device == "cuda"


@pytest.mark.parametrize("protocol", ["v2-pixels", "v2-png", "v2-json", "v1"])
def test_payloads_are_well_formed(protocol: str) -> None:
    tiles = synthetic_tiles(2, 28, seed=3)
    payload = build_payload(protocol, "m", tiles)
    if protocol.startswith("v2-p"):
        length = int(payload.headers[HEADER])
        header = json.loads(payload.body[:length])
        assert header["inputs"][0]["parameters"]["binary_data_size"] == len(payload.body) - length
        if protocol == "v2-png":
            (first,) = struct.unpack("<I", payload.body[length : length + 4])
            assert payload.body[length + 4 : length + 12] == b"\x89PNG\r\n\x1a\n" and first > 0
    else:
        assert json.loads(payload.body)
    assert payload.tiles == 2


def test_jpeg_payloads_carry_real_he_texture_as_base64_jpeg() -> None:
    from bench.load.payloads import tiles_for

    tiles = tiles_for("v2-json-jpeg", 2, 64)
    assert tiles.shape == (2, 64, 64, 3) and not np.array_equal(tiles, synthetic_tiles(2, 64))
    doc = json.loads(build_payload("v2-json-jpeg", "m", tiles).body)
    (tile_input,) = doc["inputs"]
    assert tile_input["name"] == "tiles" and tile_input["datatype"] == "BYTES"
    assert tile_input["shape"] == [2]
    assert base64.b64decode(tile_input["data"][0])[:3] == b"\xff\xd8\xff"  # JPEG SOI
    v1 = json.loads(build_payload("v1-jpeg", "m", tiles).body)
    assert base64.b64decode(v1["instances"][1]["image_data"])[:3] == b"\xff\xd8\xff"


def test_rest_output_rows_reads_v2_and_v1() -> None:
    v2 = json.dumps({"outputs": [{"name": "embedding", "shape": [3, 8], "data": []}]}).encode()
    assert rest_output_rows(v2, {}) == (3, 8)
    v1 = json.dumps({"predictions": [{"output": [0.0] * 5}] * 2}).encode()
    assert rest_output_rows(v1, {}) == (2, 5)


def test_synthetic_tiles_are_deterministic_and_distinct() -> None:
    a, b = synthetic_tiles(2, 32, seed=1), synthetic_tiles(2, 32, seed=1)
    assert a.dtype == np.uint8 and a.shape == (2, 32, 32, 3)
    assert np.array_equal(a, b) and not np.array_equal(a[0], a[1])


def test_cells_past_the_deadline_are_skipped_without_load() -> None:
    from bench.matrix.cells import run_cells

    class NoClient:
        def run(self, job: dict) -> dict:
            raise AssertionError("no cell may run past the deadline")

    case = ModelCase("m", "h0-mini", "tiny")
    cells = [Cell("histoserve", "v1", 1, 1), Cell("naive", "v2-pixels", 4, 1)]
    out = run_cells(
        NoClient(),
        {},
        cells,
        case=case,
        tile_size=224,
        speeds={"histoserve": 100.0, "naive": 10.0},
        windows=Windows(),
        deadline=0.0,
        log=lambda _: None,
    )
    assert [r["skipped"].startswith("the run's time budget") for r in out] == [True, True]


def test_load_generator_imports_neither_torch_nor_kserve() -> None:
    """tritonclient.grpc and kserve cannot share a process; histoserve.wire must stay numpy-only."""
    code = (
        "import sys, bench.load.generator, bench.load.payloads, histoserve.wire; "
        "print(sorted(m for m in ('torch', 'kserve') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_target_rows_mark_each_goal_and_p99() -> None:
    from bench.markdown import target_rows

    rows = target_rows(
        [
            {"target": "a", "ratio": 1.3, "goal": 1.25, "met": True, "p99_ms": [254.2, 266.0]},
            {"target": "b", "ratio": 1.1, "goal": 1.0, "met": False, "at_most": True},
        ]
    )
    assert rows[2] == "| a (p99 254 vs 266 ms) | 1.30 | >= 1.25 | yes |"
    assert rows[3] == "| b | 1.10 | <= 1.00 | no |"


def test_crossing_ratios_and_per_core_figures() -> None:
    from bench.stages import crossing

    paced = [
        {"server": "one", "protocol": "v2-pixels", "cpu_ms_per_request": 0.50},
        {"server": "two", "protocol": "v2-pixels", "cpu_ms_per_request": 0.55},
        {"server": "one", "protocol": "v2-grpc", "cpu_ms_per_request": 0.40},
        {"server": "two", "protocol": "v2-grpc", "cpu_ms_per_request": 0.60},
        {"server": "one", "protocol": "v1-jpeg", "cpu_ms_per_request": None},
    ]
    ratios = crossing.cpu_ratios(paced, "one", "two")
    assert [round(r["ratio"], 2) for r in ratios] == [1.1, 1.5]
    assert [r["met"] for r in ratios] == [True, False] and all(r["at_most"] for r in ratios)
    cell = crossing.per_core({"throughput": 4000.0, "server_cores": 2.0})
    assert cell["tiles_per_s_per_core"] == 2000.0
    assert cell["mb_per_s_per_core"] == 2000.0 * 224 * 224 * 3 / 1e6
    assert cell["cores_for_gpu"] == crossing.GPU_TILES_PER_S / 2000.0
    assert "cores_for_gpu" not in crossing.per_core({"throughput": 10.0, "server_cores": 0.0})


def test_padded_slides_give_each_slide_its_own_answer() -> None:
    """The benchmark's padded forward is only worth timing if it equals one slide a forward."""
    import torch

    from bench.studies.slides import padded_forward
    from predictor.families import build_demo_model
    from predictor.spec import BUILTIN_SPECS

    module = build_demo_model(BUILTIN_SPECS["abmil-demo"]).eval()
    rng = np.random.default_rng(3)
    slides = [torch.from_numpy(rng.normal(size=(n, 1536)).astype(np.float32)) for n in (1, 7, 30)]
    with torch.no_grad():
        prediction, attention = padded_forward(module, slides)
        for i, slide in enumerate(slides):
            want_prediction, want_attention, _ = module(slide)
            assert torch.allclose(prediction[i], want_prediction, atol=1e-5)
            assert torch.allclose(attention[i, : len(slide)], want_attention, atol=1e-6)
            assert float(attention[i, len(slide) :].abs().sum()) == 0.0  # padding gets nothing
