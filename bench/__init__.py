"""histoserve benchmark: serving efficiency against the package's own speed and baselines.

``python -m bench.run --out bench/results`` measures, in one run and side by
side, the package's own forward throughput (the limit), stage-1 costs, the
live server under closed-loop load for every protocol, and two baselines (the
same server with batching off, and a naive KServe model), and writes JSON,
Markdown and PNG results. See ``bench/README.md``.

Modules: :mod:`bench.config` (profiles), :mod:`bench.packages` (cached
packages), :mod:`bench.limit` (in-process forward), :mod:`bench.stage1`,
:mod:`bench.servers` (server subprocesses), :mod:`bench.naive` (baseline b),
:mod:`bench.payloads` and :mod:`bench.loadgen` (the load client, its own
process), :mod:`bench.cells` (the matrix), :mod:`bench.targets`,
:mod:`bench.report` and :mod:`bench.plots`.
"""
