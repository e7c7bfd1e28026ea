"""The NVIDIA Triton baseline: the same package served by Triton, beside histoserve.

:mod:`bench.triton.baseline` is the orchestrator's side (start Triton, check
its answers, run its cells beside histoserve's); :mod:`~bench.triton.server`
and :mod:`~bench.triton.embedding_check` run under ``.venv-triton/bin/python``
as scripts (``nvidia-pytriton`` pins ``numpy<2``; they import neither
``predictor`` nor ``kserve``); :mod:`~bench.triton.report` is ``results.md``'s
Triton section.
"""
