"""Slide heads: one slide a forward against padding several slides into one, and the served rate.

``python -m bench.studies.slides [--out FILE.json]`` (not part of ``make bench``; a
few minutes). Two parts, both on ``abmil-demo`` (gated-attention ABMIL,
D = 1,536):

- **Padding or not**, on the module itself (eager, this process): a
  cohort-like mix of slides (N from 1,000 to 20,000, seeded) run one slide a
  forward, and in padded batches of 4 and 16 with a mask (attention logits of
  the padding set to -inf). The padded answers are checked equal to the
  per-slide ones first. Reported: slides/s and the largest input tensor each
  way (the padded batch is B x N_max x D).
- **Served**, one slide a request over binary REST to the real server (the
  package histoserve serves, one slide a forward): seconds per slide and
  slides/s for N = 1,000, 10,000 and 100,000 (FP16 features for the last: a
  FP32 one is over the body limit), and the server's peak resident memory
  (``VmHWM``) after each size.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

MIX_SEED = 5
MIX_SLIDES = 32
MIX_RANGE = (1_000, 20_000)
PAD_BATCHES = (4, 16)
SERVED_N = (1_000, 10_000, 100_000)
BODY_LIMIT = 400 * 2**20


def padded_forward(module: Any, slides: list[Any]) -> tuple[Any, Any]:
    """``(prediction [B, C], attention [B, N_max])`` of ``slides`` in one masked forward."""
    import torch

    n_max = max(s.shape[0] for s in slides)
    batch = torch.zeros(len(slides), n_max, slides[0].shape[1])
    mask = torch.zeros(len(slides), n_max, dtype=torch.bool)
    for i, s in enumerate(slides):
        batch[i, : s.shape[0]] = s
        mask[i, : s.shape[0]] = True
    h = module.project(batch)
    gate = torch.tanh(module.attention_v(h)) * torch.sigmoid(module.attention_u(h))
    logits = module.attention_w(gate).squeeze(-1).masked_fill(~mask, float("-inf"))
    attention = torch.softmax(logits, dim=1)
    embedding = torch.einsum("bn,bne->be", attention, h)
    return torch.softmax(module.classifier(embedding), dim=-1), attention


def _mix() -> list[Any]:
    import torch

    rng = np.random.default_rng(MIX_SEED)
    sizes = rng.integers(*MIX_RANGE, size=MIX_SLIDES)
    return [torch.from_numpy(rng.normal(size=(int(n), 1536)).astype(np.float32)) for n in sizes]


def measure_padding() -> dict[str, Any]:
    """Slides/s one slide a forward and padded in batches, on the same mix."""
    import torch

    from predictor.families import build_demo_model
    from predictor.spec import BUILTIN_SPECS

    module = build_demo_model(BUILTIN_SPECS["abmil-demo"]).eval()
    slides = _mix()
    out: dict[str, Any] = {"slides": len(slides), "n_range": list(MIX_RANGE)}
    with torch.no_grad():
        single = [module(s) for s in slides[:4]]
        padded, attention = padded_forward(module, slides[:4])
        for i, (pred, att, _) in enumerate(single):
            assert torch.allclose(padded[i], pred, atol=1e-5)
            assert torch.allclose(attention[i, : att.shape[0]], att, atol=1e-6)
        started = time.perf_counter()
        for s in slides:
            module(s)
        seconds = time.perf_counter() - started
        out["one_a_forward"] = {"slides_per_s": len(slides) / seconds,
                                "largest_input_mb": max(s.numel() for s in slides) * 4 / 1e6}  # fmt: skip
        for b in PAD_BATCHES:
            started = time.perf_counter()
            for i in range(0, len(slides), b):
                padded_forward(module, slides[i : i + b])
            seconds = time.perf_counter() - started
            largest = max(
                len(slides[i : i + b]) * max(s.shape[0] for s in slides[i : i + b])
                for i in range(0, len(slides), b)
            )
            out[f"padded_{b}"] = {"slides_per_s": len(slides) / seconds,
                                  "largest_input_mb": largest * 1536 * 4 / 1e6}  # fmt: skip
    return out


def measure_served(log_dir: Path) -> list[dict[str, Any]]:
    """Seconds a slide and the server's peak RSS, one slide a request, for each N."""
    import httpx

    from harness.packages import copy_package_dir, demo_package
    from harness.server import start_server
    from histoserve import wire

    package = demo_package("abmil-demo", max_batch=200_000)
    server = start_server(
        copy_package_dir(package, log_dir / "model"), log_dir, "--max_body_bytes", str(BODY_LIMIT)
    )
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    rows = []
    try:
        for n in SERVED_N:
            dtype = np.float16 if n > 40_000 else np.float32
            features = np.random.default_rng(n).normal(size=(n, 1536)).astype(dtype)
            content, headers = wire.encode_request({"features": features})
            times = []
            for _ in range(3):
                started = time.perf_counter()
                r = httpx.post(url, content=content, headers=headers, timeout=600)
                times.append(time.perf_counter() - started)
                assert r.status_code == 200, r.text[:300]
            rows.append({"n": n, "dtype": str(np.dtype(dtype)), "body_mb": len(content) / 1e6,
                         "seconds_per_slide": min(times), "slides_per_s": 1 / min(times),
                         "server_peak_rss_mb": _peak_rss_mb(server.pid)})  # fmt: skip
    finally:
        server.stop()
    return rows


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def section(part: dict[str, Any]) -> list[str]:
    """Markdown of both parts."""
    pad = part["padding"]
    lines = [
        f"| way ({pad['slides']} slides, N {pad['n_range'][0]:,}-{pad['n_range'][1]:,}) "
        "| slides/s | largest input MB |",
        "| --- | ---: | ---: |",
    ]
    for key in ["one_a_forward", *(f"padded_{b}" for b in PAD_BATCHES)]:
        lines.append(
            f"| {key} | {pad[key]['slides_per_s']:.1f} | {pad[key]['largest_input_mb']:.0f} |"
        )
    lines += ["", "| N | dtype | body MB | s / slide | slides/s | server peak RSS MB |",
              "| ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in part["served"]:
        lines.append(
            f"| {r['n']:,} | {r['dtype']} | {r['body_mb']:.0f} | {r['seconds_per_slide']:.3f} "
            f"| {r['slides_per_s']:.1f} | {r['server_peak_rss_mb']:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/histoserve-slides.json"))
    args = parser.parse_args(argv)
    log_dir = args.out.parent / f"{args.out.stem}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    part = {"padding": measure_padding(), "served": measure_served(log_dir)}
    args.out.write_text(json.dumps(part, indent=1))
    print("\n".join(section(part)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
