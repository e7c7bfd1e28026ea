"""``make gpu-check`` and ``bench/gpu/bench.sh``: the scripts a lent GPU runs, run here first on the CPU.

No GPU here: ``make gpu-check DRY_RUN=1`` runs every stage of
:mod:`bench.gpu.check` on the CPU with the same package builder (ViT-g and
ViT-B at depth 1, the tiny demos; the tests' cache), through the real
servers, start-up and batcher, so the script a GPU machine runs is not
first executed there. A forced OOM needs a GPU's allocator: the dry run
fakes the package's failure and the allocator's ``num_ooms`` counter
(:func:`bench.gpu.stages.oom_split`). The plan's own accounting, the loud
failure of a missing package, NVML's parsing and the wheels' unpacking are
checked beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.gpu import check as gpu_check
from bench.gpu import env as gpu_env
from bench.gpu import nvml as gpu_nvml
from bench.gpu.packages import PLAN
from bench.gpu.stages import Context
from harness.packages import package_in

REPO = Path(__file__).resolve().parents[2]
STAGES = ["budget", "environment", "export", *(s.name for s in gpu_check.STAGES)]


def test_gpu_script_parses() -> None:
    proc = subprocess.run(
        ["bash", "-n", str(REPO / "bench" / "gpu" / "bench.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_the_plan_fits_nine_minutes_with_a_minute_to_spare_by_its_own_accounting() -> None:
    assert gpu_check.planned_seconds() + gpu_check.SLACK_S <= gpu_check.TOTAL_S
    assert gpu_check.SLACK_S >= 60 and gpu_check.DEADLINE_S < gpu_check.TOTAL_S
    budget = gpu_check.budget()
    assert budget["slack_s"] >= 60 and budget["planned_s"] == gpu_check.planned_seconds()
    assert "vit-b-fp32" not in {e.name for e in PLAN}
    groups = {e.group for e in PLAN}
    for group in groups:  # the GPU machine's cores, one group at a time
        assert sum(e.threads for e in PLAN if e.group == group) <= 16
    real = [e.group for e in PLAN if e.name in ("vit-g-bf16", "vit-b-bf16")]
    assert len(set(real)) == 2 and all(  # the real models autotune alone
        [e.name for e in PLAN if e.group == g] in (["vit-g-bf16"], ["vit-b-bf16"]) for g in real
    )
    assert PLAN[-1].name == "vit-g-bf16"  # never timed: last, so an overrun costs only itself
    names = [s.name for s in gpu_check.STAGES]
    assert names[:3] == ["matmul_rate", "sweep", "defaults"]


def test_a_missing_package_fails_the_stage_never_falls_back(tmp_path: Path) -> None:
    ctx = Context(False, "cuda", tmp_path, 1.0, {"tiny-bf16": tmp_path / "tiny.pt2"})
    with pytest.raises(RuntimeError, match="vit-b-bf16 was not exported"):
        ctx.require("vit-b-bf16")
    result = gpu_check._timed(gpu_check._function("timing:copy_vs_compute"), ctx)
    assert "vit-b-bf16 was not exported" in result["error"]


def test_nvidia_smi_lines_and_the_sampler() -> None:
    assert gpu_nvml.parse_smi("87, 1980, 612.45, 40123") == (87.0, 1980.0, 612.45, 40123.0)
    assert gpu_nvml.parse_smi("[N/A], 1980, 612.45, 40123") is None
    assert gpu_nvml.parse_smi("") is None
    fake = [sys.executable, "-c", "print('50, 1500, 300.5, 1024')"]
    with gpu_nvml.GpuSampler(gpu_nvml.smi_reader(command=fake), period_s=0.05) as sampler:
        while len(sampler.samples) < 2:
            pass
    summary = sampler.summary()
    assert summary["util_pct_mean"] == 50.0 and summary["power_w_max"] == 300.5
    with gpu_nvml.GpuSampler(lambda: 1 / 0, period_s=0.01) as broken:  # never fails the window
        pass
    assert broken.summary()["samples"] == 0


def test_carried_wheels_unpack_without_pip(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("demo_pkg/__init__.py", "VALUE = 7\n")
        whl.writestr("demo-1.0.data/purelib/demo_extra.py", "EXTRA = 8\n")
        whl.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    site = tmp_path / "site"
    assert gpu_env.unpack_wheels(wheels, site) == 1
    code = "import demo_pkg, demo_extra; print(demo_pkg.VALUE + demo_extra.EXTRA)"
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.strip() == "15", done.stderr


@pytest.mark.slow  # about 10 minutes on 2 shared cores: the exports one at a time, the defaults grid, one served window (`make test-long`)
def test_make_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    proc = subprocess.run(
        ["make", "-s", "gpu-check", "DRY_RUN=1", f"OUT={out}", f"CHECK_PYTHON={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "gpu-check.json").read_text())
    assert list(data) == STAGES
    assert all("error" not in r and "skipped" not in r for r in data.values()), data
    assert (out / "pip-list.txt").is_file() and "torch" in (out / "pip-list.txt").read_text()
    logs = {p.name for p in (out / "logs").iterdir()}
    dry = [e for e in PLAN if e.dry]  # all but the timm path: no timm beside the CPU torch
    assert {f"export-{e.name}.log" for e in dry} <= logs
    assert any(name.startswith("histoserve") for name in logs), logs  # server logs under $OUT
    export = data["export"]
    assert all(export[e.name]["seconds"] is not None for e in dry)
    assert all(export[e.name]["loads"] for e in dry)  # each loaded in a process of its own
    assert all("load_s" in export[e.name] and "forward" in export[e.name]["steps"] for e in dry)
    assert data["h0_user_path"]["left out"] == "needs h0-timm-bf16 (--packages)"
    sweep = data["sweep"]
    for name in ("vit-g-bf16", "vit-b-bf16"):
        point = sweep[name]["batch 2"]
        assert point["tiles_per_s"] > 0 and point["tflops"] > 0 and point["of_matmul"] > 0
        assert sweep[name]["best_batch"] in (1, 2)
    assert data["matmul_rate"]["tflops"] > 0
    served = data["served"]
    cells = [k for k in served if " x" in k]
    assert cells == ["vit-b-bf16 x1 fe1"]
    assert all(served[c]["throughput"] > 0 and served[c]["of_alone"] for c in cells)
    for c in cells:  # the server's own device series, recorded after the window
        totals = [v for k, v in served[c]["device_series"].items() if "kind=total" in k]
        assert totals and all(v > 0 for v in totals), served[c]["device_series"]
    grid = data["defaults"]
    for name in ("vit-b-bf16", "vit-g-bf16"):
        keys = [k for k in grid[name] if k.startswith("max_batch_size")]
        assert keys == [f"max_batch_size {b} max_latency_ms {ms}" for b in (1, 2) for ms in (2, 10)]
        assert all(grid[name][k]["tiles_per_s"] > 0 and grid[name][k]["p99_ms"] for k in keys)
    assert data["budget"]["slack_s"] >= 60 and "used_mib" in sweep["vit-b-bf16"]["batch 2"]
    assert all(served[c]["gpu"]["source"] == "none" for c in cells)  # no GPU here
    direct = data["served_equals_direct"]
    assert direct["vit-b-bf16"]["max_abs_diff"] == 0.0 and direct["vit-g-bf16"]["ok"]
    assert direct["tiny-fp32"]["ok"]
    assert 0.99 < data["bf16_vs_fp32"]["tiny"]["min_cosine"] <= 1.0 + 1e-6
    assert data["bf16_families"]["ok"] and data["oom_split"]["answered"] == 64
    assert data["oom_split"]["batches"] == 3  # 64 failed, then its halves of 32
    assert data["overlap"]["ratio"] > 0
    jpeg = data["jpeg"]  # no GPU here: both servers decode on the CPU, and say so
    assert jpeg["ok"] and jpeg["served"]["cpu_equals_pixels"]
    assert jpeg["served"]["device reports"] == jpeg["served"]["cpu reports"] == "cpu"
    assert jpeg["decode"]["device_tiles_per_s"] > 0 and jpeg["compose"]["slide A tiles_per_s"] > 0
    throughput = data["throughput"]
    assert throughput["limit"]["tiles_per_s"] > 0 and throughput["package"] == "vit-b-bf16"
    assert data["copy_vs_compute"]["forward_ms"] > 0
    assert 0.0 <= data["event_loop"]["progress"] <= 1.5
    table = (out / "gpu-check.md").read_text()
    assert all(f"| {stage} |" in table for stage in STAGES)


def test_the_wheelhouse_keeps_grpcio() -> None:
    """tritonclient's gRPC stubs need a newer grpcio than the GPU image may carry."""
    makefile = (REPO / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("PREINSTALLED :="))
    assert "grpcio" not in line and "numpy-*" in line


def test_each_gpu_export_has_its_threads_and_its_own_inductor_cache(tmp_path: Path) -> None:
    from bench.gpu.packages import _env, planned

    vit_g = _env(planned("vit-g-bf16"), False, tmp_path)
    assert vit_g["TORCHINDUCTOR_COMPILE_THREADS"] == "16" == vit_g["OMP_NUM_THREADS"]
    assert vit_g["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor" / "vit-g-bf16")
    dry = _env(planned("vit-g-bf16"), True, tmp_path)  # the dry run keeps the tests' cache
    assert dry.get("TORCHINDUCTOR_CACHE_DIR") == os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def test_a_package_that_crashes_its_loader_fails_its_own_check_only(
    tmp_path: Path, embedding_package_dir: Path
) -> None:
    from bench.gpu.packages import load_checks
    from harness.native_crash import misbehaving_model_dir

    good = package_in(embedding_package_dir)
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(good.read_bytes()[:4096])  # a truncated archive: the loader refuses it
    crashing = package_in(misbehaving_model_dir(embedding_package_dir, "segv", tmp_path / "segv"))
    checks = load_checks({"good": good, "broken": broken, "crashing": crashing}, "cpu")
    assert checks["good"]["loads"] and "forward" in checks["good"]["steps"]
    assert not checks["broken"]["loads"] and "broken.pt2" in checks["broken"]["error"]
    assert not checks["crashing"]["loads"]
    assert "signal SIGSEGV" in checks["crashing"]["error"]
    assert "during step 'load'" in checks["crashing"]["error"]


def test_an_export_whose_proof_crashes_the_loader_is_tried_again_with_mapped_weights(
    tmp_path: Path, embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash is real (a package whose library raises SIGSEGV, through the exporter's own
    proof); the two exports around it are stood in for: a CUDA export cannot run here."""
    from bench.gpu import packages
    from harness.native_crash import misbehaving_model_dir
    from predictor.errors import CheckpointError
    from predictor.packages.metadata import read_metadata
    from predictor.runtime.load_probe import probe_load

    crashing = package_in(misbehaving_model_dir(embedding_package_dir, "segv", tmp_path / "segv"))
    what = "stage load-in-fresh-process"
    with pytest.raises(CheckpointError) as crash:
        probe_load(
            crashing, "cpu", read_metadata(crashing), timeout_s=120, what=what, off_hint=None
        )
    with pytest.raises(CheckpointError) as refusal:
        probe_load(tmp_path / "none.pt2", "cpu", {}, timeout_s=120, what=what, off_hint=None)
    assert packages.crashed_loading(str(crash.value))
    mapped = str(crash.value).replace(", fp32,", ", fp32, weights mapped,")
    assert mapped != str(crash.value) and not packages.crashed_loading(
        mapped
    )  # nothing else to try
    forward = str(crash.value).replace("during step 'load'", "during step 'forward'")
    assert forward != str(crash.value) and not packages.crashed_loading(forward)
    assert not packages.crashed_loading(str(refusal.value))  # a Python error: not retried
    calls: list[tuple[list[str], str]] = []

    def export_group(entries, dry_run, work, logs, deadline_s, weights_layout):  # type: ignore[no-untyped-def]
        calls.append(([e.name for e in entries], weights_layout))
        if weights_layout == "mmap":
            return {
                e.name: {"path": "m.pt2", "seconds": 1.0, "weights_layout": "mmap"} for e in entries
            }
        return {
            e.name: {"error": "x", "seconds": 2.0, "weights_layout": weights_layout,
                     "crashed_loading": e.name == "vit-b-bf16"}
            for e in entries
        }  # fmt: skip

    monkeypatch.setattr(packages, "_export_group", export_group)
    out = packages.export_all(["vit-b-bf16", "tiny-fp32"], False, tmp_path, tmp_path)
    assert calls == [(["vit-b-bf16"], "auto"), (["vit-b-bf16"], "mmap"), (["tiny-fp32"], "auto")]
    assert out["vit-b-bf16"]["path"] == "m.pt2" and out["vit-b-bf16"]["weights_layout"] == "mmap"
    assert out["vit-b-bf16"]["first"]["crashed_loading"] and "path" not in out["tiny-fp32"]
    calls.clear()
    packages.export_all(["vit-b-bf16"], False, tmp_path, tmp_path, weights_layout="mmap")
    assert calls == [(["vit-b-bf16"], "mmap")]  # asked for mmap: nothing else to try
    calls.clear()
    short = packages.export_all(["vit-b-bf16"], False, tmp_path, tmp_path, time_left=lambda: 100.0)
    assert calls == [(["vit-b-bf16"], "auto")]  # 100 s left, ViT-B's export may take 130 s
    assert short["vit-b-bf16"]["retry"] == "not tried with mmap: 100 s left, 130 needed"


def test_exports_run_one_at_a_time_and_stages_without_their_packages_are_left_out(
    tmp_path: Path,
) -> None:
    from bench.gpu.packages import H0_TIMM, planned, timm_export_argv

    assert len({e.group for e in PLAN}) == len(PLAN)  # one export at a time
    default = {e.name for e in PLAN if e.default}
    counted = {s.name for s in gpu_check.default_stages()}
    for stage in gpu_check.STAGES:  # the accounting counts what a default run runs
        assert (stage.name in counted) == (set(stage.needs) <= default)
    assert "h0_user_path" not in counted and "sweep" in counted
    h0 = planned("h0-timm-bf16")
    assert h0.timm == H0_TIMM and not h0.dry and not h0.default
    argv = timm_export_argv(h0, tmp_path / "w.safetensors", tmp_path / "h0.pt2", "cuda")
    readme = (REPO / "README.md").read_text()
    user = f"histoserve export --spec h0 --timm {H0_TIMM} --weights h0.safetensors --output h0.pt2"
    assert user in readme  # the README's line, which the check runs (plus dtype, device, batch)
    assert argv[:6] == [
        "--spec",
        "h0",
        "--timm",
        H0_TIMM,
        "--weights",
        str(tmp_path / "w.safetensors"),
    ]
    assert gpu_check.asked_packages(argparse.Namespace(packages=None, dry_run=True)) == [
        e.name for e in PLAN if e.dry
    ]


def test_a_run_without_vit_g_leaves_it_out_rather_than_failing(tmp_path: Path) -> None:
    ctx = Context(False, "cuda", tmp_path, 1.0, {}, skipped=frozenset({"vit-g-bf16"}))
    assert ctx.asked(("vit-g-bf16", "vit-b-bf16")) == ["vit-b-bf16"]
    args = argparse.Namespace(packages=None, dry_run=False)
    assert "vit-g-bf16" not in gpu_check.asked_packages(args)
    args.dry_run = True
    assert "vit-g-bf16" in gpu_check.asked_packages(args)


def test_the_h0_user_path_stage_serves_its_package(
    tmp_path: Path, embedding_package_dir: Path
) -> None:
    """The stage's own code on the CPU, the tiny demo standing in for the timm export (no timm here)."""
    from bench.gpu.h0 import h0_user_path

    package = {"h0-timm-bf16": package_in(embedding_package_dir)}
    ctx = Context(True, "cpu", tmp_path, 0.5, package, logs=tmp_path / "logs")
    result = h0_user_path(ctx)
    assert result["embedding"] == [16, 1536] and result["finite"]
    assert result["max_abs_diff"] < 1e-4  # fp32 here; bf16 on the GPU must be 0.0 ("ok")
    assert result["served_tiles_per_s_64"] > 0 and result["in_process_tiles_per_s"] > 0
    assert result["served_over_in_process"] > 0
