"""The run's results: ``results.json``, ``results.md`` and one PNG per model.

:mod:`bench.report.output` writes them with the machine's description;
:mod:`~bench.report.results_md` assembles ``results.md`` from each stage's own
section; :mod:`~bench.report.plots` draws the plots. The number and table
format every section shares is :mod:`bench.markdown`.
"""
