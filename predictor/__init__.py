"""histoserve: a KServe predictor for histopathology tile models in AOTInductor ``.pt2`` packages.

Modules, one job each: :mod:`~predictor.spec` (model specs),
:mod:`~predictor.package` (inspect and load packages), :mod:`~predictor.export`
(build packages), :mod:`~predictor.model` (``BaseServerModel``),
:mod:`~predictor.families` (subclasses by spec family),
:mod:`~predictor.batcher` (protocol-free dynamic batching),
:mod:`~predictor.codecs` (V1/V2 decoding and encoding),
:mod:`~predictor.errors`, :mod:`~predictor.metrics`,
:mod:`~predictor.server` (KServe edge), :mod:`~predictor.cli`.
Importing the package does nothing else.
"""

__version__ = "0.1.0"
