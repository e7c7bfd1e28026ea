"""histoserve benchmark: serving efficiency against the package's own speed and baselines.

``python -m bench.run --out bench/results`` (``make bench``) measures, in one
run and side by side, the package's own forward throughput (the limit),
stage-1 costs, the live server under closed-loop load for every protocol, two
baselines (the same server with batching off, and a naive KServe model) and
NVIDIA Triton, and writes JSON, Markdown and PNG results. See
``bench/README.md``.

Layout, from the entry down: :mod:`bench.run` (the whole run) and
:mod:`bench.profiles` (its profiles); :mod:`bench.report` (results.json, .md,
plots); :mod:`bench.gpu` (the GPU check, ``make gpu-check``, and the run on
CUDA); :mod:`bench.stages` (the run's stages after the matrix);
:mod:`bench.studies` (measurements run by hand); :mod:`bench.triton` (the
Triton baseline); :mod:`bench.matrix` (the limit, the end-to-end cells, the
target cells); :mod:`bench.servers` (the servers under test and their
packages); :mod:`bench.load` (the load generator's process);
:mod:`bench.markdown` (the one number and table format).
:mod:`bench.gpu_check` only runs :mod:`bench.gpu.check` (GPU sessions call it).
"""
