"""Everything that needs a GPU: the GPU check (``make gpu-check``) and the benchmark on CUDA.

:mod:`bench.gpu.check` (``python3 -m bench.gpu.check``) runs the check on a lent
GPU in one command: :mod:`~bench.gpu.env` (carried wheels, machine facts, the
deadline), :mod:`~bench.gpu.packages` (the packages exported there), then its
stages: :mod:`~bench.gpu.sweep` (matmul rate, batch sweep),
:mod:`~bench.gpu.defaults` (the batching defaults' figures),
:mod:`~bench.gpu.served` (served vs in process, the worker's overlap),
:mod:`~bench.gpu.stages` (correctness), :mod:`~bench.gpu.jpeg` (the jpeg
transport decoded on the device) and :mod:`~bench.gpu.timing` (tiles/s, copy vs
compute, the event loop), sampled by :mod:`~bench.gpu.nvml`. ``bash
bench/gpu/bench.sh`` runs ``make bench`` on a CUDA node, and ``bash
bench/gpu/bench.sh parts`` issue 12's GPU-only parts (:mod:`~bench.gpu.parts`).
"""
