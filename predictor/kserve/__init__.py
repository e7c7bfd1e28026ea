"""KServe, in one folder: the only code of the server that imports ``kserve``.

Everything histoserve takes from KServe, extends, copies or bypasses is here,
so a KServe upgrade is reviewed by reading this folder (and
``tests/unit/kserve/``, which fails when a shape relied on changes):

* :mod:`~predictor.kserve.compat`: every KServe name the server uses, its public
  types (``Model``, ``ModelServer``, ``InferRequest``, ...) re-exported, and the
  internals reached (the REST server's uvicorn, the model registry's start
  check, the stage histograms, the gRPC servicer, ``InferInput._raw_data``);
  kserve is pinned in ``pyproject.toml`` to the version tested.
* :mod:`~predictor.kserve.dataplane`: KServe's ``DataPlane`` with three
  overrides: byte bodies go to the server's own V2 binary parser (KServe's
  decodes ``BYTES`` as text), liveness sees a lost device, readiness sees a
  drain.
* :mod:`~predictor.kserve.fast_infer`: a copy of KServe's V2 REST infer route
  (``V2Endpoints.infer``) as a raw ASGI layer, bypassing FastAPI's router and
  KServe's timing middleware on the hot route; same calls, same bytes.
* :mod:`~predictor.kserve.stage_call`: a copy of ``Model.__call__``'s stage
  timing, bypassing its per-request metric lookups.

The copies exist for the event loop's CPU per request (``docs/performance.md``,
"The request path (null model)"); on an upgrade, compare them with the KServe
functions they mirror (``tests/unit/kserve/test_compat.py`` keeps a digest of
each). The server's subclasses of ``Model`` (:mod:`predictor.model.base`) and
``ModelServer`` (:mod:`predictor.http.app`) take KServe's classes from
:mod:`~predictor.kserve.compat`; the hooks they override are KServe's public
ones, and the private parts they need are functions here.

The bottom layer: it imports nothing of histoserve (the dataplane is handed its
binary parser), so every layer may use it; the import-linter contract
``kserve-in-one-place`` keeps ``kserve`` out of every other folder.
"""
