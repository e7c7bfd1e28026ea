"""Measurements run by hand (``python -m bench.studies.X``), not part of ``make bench``.

:mod:`~bench.studies.native_reader` (reader and resize fidelity and cost),
:mod:`~bench.studies.resume_checks` (what a resumed run's checks cost),
:mod:`~bench.studies.client_http` and :mod:`~bench.studies.device_path` (the
client's HTTP path and the server's device path against an earlier commit,
interleaved) and :mod:`~bench.studies.slides` (slide heads: one slide a
forward against padded batches, and the served rate). Their figures are quoted
in ``docs/performance.md`` and ``docs/cohorts.md``.
"""
