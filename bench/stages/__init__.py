"""The stages of ``make bench`` after the matrix; most also run alone (``python -m bench.stages.X``).

Server side: :mod:`~bench.stages.stage1` (a request's parse, decode and
transform per tile), :mod:`~bench.stages.null_rate` (the serving path's
ceiling on a null model), :mod:`~bench.stages.gil` (the event loop during a
forward), :mod:`~bench.stages.workers` (one vs two device workers),
:mod:`~bench.stages.instances` (two instances each, against Triton),
:mod:`~bench.stages.frontends` and :mod:`~bench.stages.crossing` (one front end
against N), :mod:`~bench.stages.defaults` (each server at its defaults) and
:mod:`~bench.stages.coldstart` (process start to ready). Client side:
:mod:`~bench.stages.embed_client` (does ``histoserve embed`` keep up) and
:mod:`~bench.stages.jpeg_transport` (slide reading and the jpeg transport).
Each stage writes its own ``results.md`` section. They run with any profile
(``bench/gpu/bench.sh`` runs them on CUDA).
"""
