"""The GPU check's correctness stages (:mod:`bench.gpu.check` runs them; timings are in :mod:`bench.gpu.timing`).

Each stage takes the :class:`Context` and returns a JSON-able dict with an
``ok`` flag where there is something to pass or fail. Served answers come
from real servers (``python -m predictor``, started as the benchmark starts
them); "direct" is the package run in this process on the same device, fed
by the server's own normaliser, so on the same batch the two must agree to
the last bit in bf16 and to 1e-4 in fp32.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.load.payloads import he_crops
from histoserve.wire import MODES

SHIM_FAILURE = (
    "aoti_torch_empty_strided(...) API call failed at model.wrapper.cpp, line 1 (dry run)"
)


@dataclass
class Context:
    """What every stage shares: the device, the packages, where logs go, how long to measure.

    ``figures`` carries measurements later stages read (the matmul rate),
    ``best`` each real model's best batch from the sweep.
    """

    dry_run: bool
    device: str  # "cuda" or "cpu"
    work: Path
    window_s: float
    packages: dict[str, Path] = field(default_factory=dict)
    logs: Path | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    best: dict[str, int] = field(default_factory=dict)
    skipped: frozenset[str] = frozenset()
    """Packages of the plan this run did not ask for (``--packages``): left out, not failed."""

    def asked(self, names: Sequence[str]) -> list[str]:
        """``names`` less the packages this run did not ask for."""
        return [n for n in names if n not in self.skipped]

    @property
    def batch(self) -> int:
        """The batch the timing stages use: 64 on the GPU, 8 on the dry run (CPU seconds)."""
        return 8 if self.dry_run else 64

    @property
    def first(self) -> str:
        """The device one server or model runs on (``cuda:0`` or ``cpu``)."""
        return "cuda:0" if self.device == "cuda" else "cpu"

    @property
    def log_dir(self) -> Path:
        """Where server logs go (``$OUT/logs`` in the check)."""
        return self.logs or self.work / "logs"

    def require(self, name: str) -> Path:
        """Package ``name``; a stage that needs a package not exported (or not loading) fails, loudly.

        Never a fallback to another package: figures of the tiny demo
        standing in for ViT-B would pass and mean nothing.

        Raises:
            RuntimeError: ``name`` was not exported (see the export stage).
        """
        if name not in self.packages:
            raise RuntimeError(
                f"package {name} was not exported or does not load (see the export stage)"
            )
        return self.packages[name]


@contextmanager
def servers(ctx: Context, packages: dict[str, Path], *flags: str) -> Iterator[dict[str, Any]]:
    """One histoserve per package, started together, on ``ctx.first``; stopped on exit."""
    from bench.servers.launch import start_histoserve, wait_all_ready

    started = {
        name: start_histoserve(
            path, model=name, device=ctx.first, max_batch_size=64, max_latency_ms=2,
            max_queue_size=4096, workers=2 if ctx.dry_run else 8,
            threads=2 if ctx.dry_run else 4, log_dir=ctx.log_dir,
        )
        for name, path in packages.items()
    }  # fmt: skip
    try:
        yield dict(wait_all_ready(started))
    finally:
        for server in started.values():
            server.stop()


def infer(server: Any, inputs: dict[str, np.ndarray], mode: str | None = None) -> dict[str, Any]:
    """One V2 binary REST request; its outputs as numpy arrays."""
    import httpx

    from histoserve import wire

    body, headers = wire.encode_request(inputs, parameters={"mode": mode} if mode else None)
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    response = httpx.post(url, content=body, headers=headers, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(
            f"{server.model_name}: HTTP {response.status_code}: {response.text[:300]}"
        )
    outputs, _ = wire.decode_response(response.content, response.headers.get(wire.HEADER))
    return outputs


def direct(path: Path, device: str, tiles: np.ndarray, *extra: Any) -> list[np.ndarray]:
    """The package's own outputs on ``tiles``, normalised by the server's normaliser, as float32."""
    import torch

    from predictor.device.normalizer import Normalizer
    from predictor.runtime.loader import load_package

    package = load_package(path, torch.device(device))
    spec = package.embedded_spec
    with torch.inference_mode():
        x = Normalizer(spec, package.device, package.input_dtype)(list(tiles))
        more = [torch.as_tensor(e).to(package.device) for e in extra]
        outputs = package(x, *more)
        return [o[: len(tiles)].float().cpu().numpy() for o in outputs]


def served_equals_direct(ctx: Context) -> dict[str, Any]:
    """Each embedding package served vs run directly on the same 16 H&E crops, one batch."""
    wanted = ctx.asked(("vit-b-bf16", "vit-g-bf16", "tiny-fp32", "tiny-bf16"))
    names = [n for n in wanted if n in ctx.packages]
    tiles = he_crops(16)
    out: dict[str, Any] = {  # a missing package fails the stage; the others still count
        n: {"error": "not exported", "ok": False} for n in wanted if n not in names
    }
    with servers(ctx, {n: ctx.require(n) for n in names}) as running:
        for name in names:
            served = infer(running[name], {"pixels": tiles})["embedding"]
            (own,) = direct(ctx.packages[name], ctx.first, tiles)
            diff = float(np.abs(served - own).max())
            bound = 0.0 if name.endswith("bf16") else 1e-4 * max(1.0, float(np.abs(own).max()))
            out[name] = {"max_abs_diff": diff, "bound": bound, "ok": diff <= bound}
    out["ok"] = all(v["ok"] for v in out.values())
    return out


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def bf16_vs_fp32(ctx: Context) -> dict[str, Any]:
    """Cosine between the fp32 and bf16 packages' embeddings (same weights) of 64 H&E crops."""
    tiles = he_crops(64)
    out: dict[str, Any] = {}
    for model in ("tiny",):  # no fp32 ViT-B: its export would not fit the plan
        (fp32,) = direct(ctx.require(f"{model}-fp32"), ctx.first, tiles)
        (bf16,) = direct(ctx.require(f"{model}-bf16"), ctx.first, tiles)
        cos = _cosines(fp32, bf16)
        out[model] = {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    out["ok"] = all(v["min_cosine"] > 0.99 for v in out.values() if isinstance(v, dict))
    return out


def bf16_families(ctx: Context) -> dict[str, Any]:
    """bf16 m-optimus (every mode, with and without bulk RNA) and tissue-seg, served vs direct."""
    from predictor.families.multimodal.genes import read_gene_ids

    packages = {n: ctx.require(n) for n in ("m-optimus-bf16", "tissue-seg-bf16")}
    out: dict[str, Any] = {}
    with servers(ctx, packages) as running:
        mm = packages["m-optimus-bf16"]
        genes = len(read_gene_ids(mm.parent / "genes_in.csv"))
        tiles = he_crops(4)
        rna = np.random.default_rng(0).poisson(20.0, (4, genes)).astype(np.float32)
        log_rna = np.log1p(rna)
        log_rna[3] = np.nan  # the last tile: no bulk RNA
        # Direct on the very batches the server runs (3 tiles, then 1): same kernels, same bits.
        _, embedding = direct(mm, ctx.first, tiles[:3], log_rna[:3])
        _, lone = direct(mm, ctx.first, tiles[3:], log_rna[3:])
        embedding = np.concatenate([embedding, lone])
        for mode in MODES:
            got = infer(running["m-optimus-bf16"], {"pixels": tiles[:3], "bulk_rna": rna[:3]}, mode)
            finite = all(bool(np.isfinite(v).all()) for v in got.values())
            entry: dict[str, Any] = {"outputs": sorted(got), "finite": finite}
            if "embedding" in got:
                entry["embedding_max_abs_diff"] = float(
                    np.abs(got["embedding"] - embedding[:3]).max()
                )
            out[f"m-optimus {mode}"] = entry
        alone = infer(running["m-optimus-bf16"], {"pixels": tiles[3:]}, "embedding")["embedding"]
        out["m-optimus without bulk RNA"] = {
            "max_abs_diff": float(np.abs(alone - embedding[3:]).max())
        }
        seg = packages["tissue-seg-bf16"]
        seg_tiles = np.concatenate([he_crops(2, 512), np.full((1, 512, 512, 3), 255, np.uint8)])
        mask = next(iter(infer(running["tissue-seg-bf16"], {"pixels": seg_tiles}).values()))
        (logits,) = direct(seg, ctx.first, seg_tiles)
        want = (logits.reshape(mask.shape) > 0).astype(mask.dtype)
        out["tissue-seg"] = {
            "mask_shape": list(mask.shape),
            "agreement": float((mask == want).mean()),
        }
    out["ok"] = (
        all(v.get("finite", True) for v in out.values())
        and all(v.get("embedding_max_abs_diff", 0.0) == 0.0 for v in out.values())
        and out["m-optimus without bulk RNA"]["max_abs_diff"] == 0.0
        and out["tissue-seg"]["agreement"] > 0.999
    )
    return out


async def _submit_all(model: Any, samples: Sequence[Any]) -> tuple[int, int]:
    """Every sample in one submission; (answered, batches the worker ran)."""
    await model.start_batching()
    batcher = model.batcher
    mode = model.family.resolve_mode(None)
    results = await asyncio.gather(*batcher.submit(list(samples), key=mode), return_exceptions=True)
    await batcher.close()
    answered = sum(not isinstance(r, BaseException) for r in results)
    return answered, sum(w.batches for w in batcher.workers)


def oom_split(ctx: Context) -> dict[str, Any]:
    """A batch of 64 forced out of memory (``set_per_process_memory_fraction``): split and answered.

    On the dry run (no GPU) the package's runner raises the AOTInductor
    shim's message for batches above 32 and the allocator's ``num_ooms`` is
    a counter the fake raises, so the same classification path runs.
    """
    from bench.gpu.parts import _items, build

    name = "vit-b-bf16"
    path = ctx.require(name)
    samples = _items(64, 224)  # batch items: prepared sample and request
    model = build(path, ctx.first, 64)
    try:
        if ctx.dry_run:
            _fake_oom(model, above=32)
            answered, batches = asyncio.run(_submit_all(model, samples))
            return {
                "package": name,
                "answered": answered,
                "batches": batches,
                "ok": answered == 64 and batches == 3,
            }
        return _real_oom(model, samples, name)
    finally:
        model.stop()


def _fake_oom(model: Any, above: int) -> None:
    from predictor.device.failures import OomCounter

    counter = {"num_ooms": 0}
    runner = model.served.package.runner

    def failing(*inputs: Any) -> Any:
        if inputs[0].shape[0] > above:
            counter["num_ooms"] += 1
            raise RuntimeError(SHIM_FAILURE)
        return runner(*inputs)

    object.__setattr__(model.served.package, "runner", failing)
    model.device_side.workers._ooms = OomCounter(lambda device: dict(counter))


def _split(items: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Batch items as ``forward_batch`` takes them: samples, requests."""
    return [i.sample for i in items], [i.request for i in items]


def _real_oom(model: Any, samples: Sequence[Any], name: str) -> dict[str, Any]:
    import torch

    device = torch.device("cuda:0")
    mode = model.family.resolve_mode(None)
    model.forward_batch(*_split(samples), mode)  # warm
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model.forward_batch(*_split(samples), mode)
    peak = torch.cuda.max_memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    out: dict[str, Any] = {"package": name, "base_mib": base >> 20, "peak_mib": peak >> 20}
    try:
        for share in (0.6, 0.45):
            torch.cuda.empty_cache()
            limit = base + share * (peak - base)
            torch.cuda.set_per_process_memory_fraction(limit / total, device)
            before = torch.cuda.memory_stats(device).get("num_ooms", 0)
            answered, batches = asyncio.run(_submit_all(model, samples))
            ooms = torch.cuda.memory_stats(device).get("num_ooms", 0) - before
            out[f"share_{share}"] = {"answered": answered, "batches": batches, "num_ooms": ooms}
            if answered == 64 and batches > 1:
                out["ok"] = True
                return out
            model.pipeline._batcher = None  # a fresh batcher for the next try
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    out["ok"] = False
    return out
