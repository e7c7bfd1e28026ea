"""histoserve: a KServe predictor for histopathology tile models in AOTInductor ``.pt2`` packages.

Layers and their modules, one job each (``docs/architecture.md`` walks one
request through them):

* Entry: :mod:`~predictor.__main__` (``python -m predictor``),
  :mod:`~predictor.cli` (flags, ``serve``/``export``/``embed``),
  :mod:`~predictor.config` (frozen configs), :mod:`~predictor.startup`
  (from config to a loaded, checked model), :mod:`~predictor.gc_policy` (the
  collector's settings while serving).
* Server edge: :mod:`~predictor.server` -- :mod:`~predictor.server.app`
  (KServe's ModelServer with drain, body limits), :mod:`~predictor.server.dataplane`
  (binary V2 bodies, liveness), :mod:`~predictor.server.edge` (the error table),
  :mod:`~predictor.server.grpc_server` (the V2 gRPC service),
  :mod:`~predictor.server.fast_infer` (the V2 REST infer route before FastAPI).
* Protocols: :mod:`~predictor.codecs` -- :mod:`~predictor.codecs.base` (the
  ``Codec`` interface), :mod:`~predictor.codecs.v1`, :mod:`~predictor.codecs.v2`,
  :mod:`~predictor.codecs.v2_response`, :mod:`~predictor.codecs.binary`,
  :mod:`~predictor.codecs.tensors`, :mod:`~predictor.codecs.images`,
  :mod:`~predictor.codecs.common`; :mod:`~predictor.samples` (the types they
  hand over). None imports torch.
* Model: :mod:`~predictor.model` (KServe adapter and lifecycle),
  :mod:`~predictor.kserve_call` (KServe's stages of one predict, run directly),
  :mod:`~predictor.admission` (admitted requests, staged tiles),
  :mod:`~predictor.stage1` (the decode thread pool),
  :mod:`~predictor.families` (per-family hooks: :mod:`~predictor.families.base`,
  :mod:`~predictor.families.embedding`, :mod:`~predictor.families.multimodal`,
  :mod:`~predictor.families.segmentation`), :mod:`~predictor.spec` (model specs).
* Scheduling and device: :mod:`~predictor.batcher`,
  :mod:`~predictor.batch_queue` and :mod:`~predictor.batch_worker`
  (protocol-free dynamic batching),
  :mod:`~predictor.device` (normalisation on the device, error classes),
  :mod:`~predictor.device_workers` (one device slot per GPU under ``--device auto``),
  :mod:`~predictor.aoti_runner` (GIL-free package runner),
  :mod:`~predictor.faults` (test-only fault injection), :mod:`~predictor.metrics`.
* Packages: :mod:`~predictor.package` -- :mod:`~predictor.package.dtypes`,
  :mod:`~predictor.package.digest`, :mod:`~predictor.package.metadata`,
  :mod:`~predictor.package.host`, :mod:`~predictor.package.genes`,
  :mod:`~predictor.package.loader`, :mod:`~predictor.package.probe`;
  building them: :mod:`~predictor.export`, :mod:`~predictor.export_sources`,
  :mod:`~predictor.demo_models`.
* Errors: :mod:`~predictor.errors` (the one error tree).
* Clients: :mod:`~predictor.wire` (the V2 binary format, client side),
  :mod:`~predictor.client` (``HistoserveClient``), :mod:`~predictor.embed`
  (``histoserve embed``: whole slides to HDF5 features).

Importing the package does nothing else.
"""

__version__ = "0.1.0"
