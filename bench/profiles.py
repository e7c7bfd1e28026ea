"""Benchmark profiles: which models, which cells, how long each window lasts.

``full`` is what ``make bench`` runs on the 2-core development machine (under
15 minutes), ``tiny`` is the harness check of ``make test-long`` (about two minutes),
``gpu`` is for a CUDA node (``bench/gpu/bench.sh``). Every number a result depends
on lives here and is written into the results JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.load.payloads import PROTOCOLS


@dataclass(frozen=True)
class ModelCase:
    """One package to benchmark and the histoserve settings it is served with.

    Attributes:
        label: Short name in results (``demo``, ``vit-s``, ``vit-g``).
        spec: Built-in spec name the package is exported for.
        preset: Demo preset (``tiny``, ``vit-s``, ``vit-g``); random weights.
        dtype: Package dtype (``fp32``, ``bf16``, ``fp16``); ``auto`` picks
            ``bf16`` on CPUs with native bf16 (AMX/AVX512-BF16), else ``fp32``.
        max_batch_size: histoserve's ``--max_batch_size`` for this model.
        max_latency_ms: histoserve's ``--max_latency_ms``.
        limit_batches: Batch sizes whose forward throughput is measured.
        max_inflight_tiles: Matrix cells with more tiles in flight
            (concurrency x tiles per request) are skipped, except target cells.
        protocols: Protocols of the end-to-end matrix for this model.
        baseline_cells: ``(concurrency, tiles)`` cells run against both baselines
            (the many-single-tile-clients cell runs with the targets).
        target_max_s: Longest target window for this model (the profile's when None).
        triton_cells: ``(concurrency, tiles)`` cells run on histoserve and on
            Triton back to back, over V2 binary REST and gRPC (see :mod:`bench.triton.baseline`).
    """

    label: str
    spec: str
    preset: str
    dtype: str = "fp32"
    max_batch_size: int = 32
    max_latency_ms: float = 5.0
    limit_batches: tuple[int, ...] = (1, 4, 8, 16, 32)
    max_inflight_tiles: int = 2048
    protocols: tuple[str, ...] = PROTOCOLS
    baseline_cells: tuple[tuple[int, int], ...] = ()
    target_max_s: float | None = None
    triton_cells: tuple[tuple[int, int], ...] = ((16, 32), (64, 1))


@dataclass(frozen=True)
class Windows:
    """Cell timing: warm-up and measured window scale with one round's expected time.

    A round is ``concurrency * tiles / limit`` seconds (every client served
    once at the model's own speed); windows are clamped to these bounds.
    A window also spans at least ``min_completions`` requests (one client
    completes one request per round), so few-client cells of big requests are
    not counted in whole requests. Target cells get longer windows (``target_*``).
    """

    warmup_min_s: float = 0.5
    warmup_max_s: float = 4.0
    window_min_s: float = 1.5
    window_max_s: float = 10.0
    warmup_rounds: float = 1.5
    window_rounds: float = 3.0
    min_completions: float = 6.0
    target_rounds: float = 6.0
    target_min_s: float = 10.0
    target_max_s: float = 20.0
    limit_s: float = 1.5
    max_requests: int = 20_000
    timeout_s: float = 180.0


@dataclass(frozen=True)
class Profile:
    """A complete benchmark configuration.

    Attributes:
        name: ``full``, ``tiny`` or ``gpu``.
        models: Packages to benchmark, in order.
        concurrencies: Closed-loop client counts.
        tile_counts: Tiles per request.
        device: ``cpu`` or ``cuda``.
        threads: ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` in every process
            (limit, servers, baselines). 1 on the 2-core CPU box: with 2, each of
            a forward's hundreds of OpenMP regions waits for its slower thread,
            and any other runnable process (the load client, HTTP handling, a
            neighbour's job) stalls them; ViT-S fell from ~70 to ~6 tiles/s.
        preprocess_workers: histoserve's stage-1 threads.
        max_queue_size: histoserve's queue bound (above the largest in-flight count).
        windows: Cell timing.
        latency_pairs: Interleaved (forward, idle request) pairs for the latency target.
        stage1_tiles: Tiles per stage-1 measurement.
        target_clients: ``(concurrency, tiles)`` of the efficiency target and
            the concurrency of the many-single-tile-clients target.
        cells_budget_s: Seconds from the start after which the remaining
            matrix and baseline cells are skipped (targets always run), so a
            run on a loaded machine still ends in time.
        triton: Run the NVIDIA Triton baseline (needs ``.venv-triton``).
        null_model: Measure single-tile requests/s and CPU per request on
            :mod:`bench.servers.null_model` (see :mod:`bench.stages.null_rate`).
        null_before: Also run the null-model cells on the server as it was
            before issue 12's request-path work (:mod:`bench.servers.before`), side by side.
        forward_runner: histoserve's ``--forward_runner``: ``gil_free`` on the
            CPU (the event loop admits and batches requests while a forward
            runs, as Triton's C++ front end does beside its model), ``torch``
            on CUDA (the forward only launches kernels there).
    """

    name: str
    models: tuple[ModelCase, ...]
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    tile_counts: tuple[int, ...] = (1, 32)
    device: str = "cpu"
    threads: int = 1
    preprocess_workers: int = 2
    max_queue_size: int = 4096
    windows: Windows = field(default_factory=Windows)
    latency_pairs: int = 30
    stage1_tiles: int = 64
    target_clients: tuple[int, int, int] = (16, 32, 64)
    cells_budget_s: float = 600.0
    triton: bool = True
    null_model: bool = True
    null_before: bool = True
    forward_runner: str = "gil_free"


_DEMO = ModelCase(
    label="demo",
    spec="h0-mini",
    preset="tiny",
    max_inflight_tiles=128,
    baseline_cells=((1, 1), (16, 1), (1, 32)),
    target_max_s=8.0,
)
_VITS = ModelCase(
    label="vit-s",
    spec="h0-mini",
    preset="vit-s",
    dtype="auto",
    max_inflight_tiles=64,
    baseline_cells=((1, 1), (16, 1)),
    target_max_s=15.0,
    triton_cells=((64, 1),),  # 16 x 32 tiles: a 17 s round on this CPU (in-flight cap)
)

PROFILES: dict[str, Profile] = {
    "full": Profile(name="full", models=(_DEMO, _VITS)),
    "tiny": Profile(
        name="tiny",
        models=(
            replace(
                _DEMO,
                limit_batches=(1, 2, 4),
                baseline_cells=((1, 1), (4, 2)),
                target_max_s=None,
                triton_cells=((4, 2),),
            ),
        ),
        concurrencies=(1, 4),
        tile_counts=(1, 2),
        windows=Windows(
            warmup_min_s=0.2,
            warmup_max_s=0.5,
            window_min_s=0.6,
            window_max_s=1.0,
            target_min_s=1.0,
            target_max_s=1.0,
            limit_s=0.3,
        ),
        latency_pairs=6,
        stage1_tiles=4,
        target_clients=(4, 2, 4),
        null_before=False,
    ),
    "gpu": Profile(
        name="gpu",
        models=(
            _DEMO,
            ModelCase(
                label="vit-g",
                spec="h0",
                preset="vit-g",
                dtype="bf16",
                max_batch_size=64,
                max_latency_ms=5.0,
                limit_batches=(1, 8, 32, 64),
                max_inflight_tiles=2048,
                baseline_cells=((1, 1), (16, 1), (16, 32)),
            ),
        ),
        device="cuda",
        forward_runner="torch",
        threads=4,
        preprocess_workers=8,
        windows=Windows(window_max_s=15.0),
    ),
}
