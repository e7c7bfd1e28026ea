"""The served model: the seed's ``BaseServerModel``, a thin adapter over its parts.

``base`` is the class a user subclasses (``from predictor import
BaseServerModel``) and KServe serves, one for every family, with the seed's
hooks ``prepare_sample``, ``forward_batch(samples, requests, mode)`` and
``preprocess_bulk_rna``. It hands every call to its parts: a request's
stages (``pipeline``: admission, codecs, the decode pool, the batcher, the
answer), the package side (``device_side``: the package, normaliser, slots
and device workers in this process, or a front end's device owner) and its
family (``family``: its named hooks, one ``outputs(mode)``; the tile family's
defaults, the embedding backbone's, are ``tiles``). Around them: admission
and the queue bound (``admission``), the decode pool (``stage1``), the JPEG
decode place (``device_jpeg``), what the batcher carries and how a worker
calls the forward (``forward``), non-finite outputs (``finite``), the
server's metrics (``metrics``) and what its devices hold (``device_stats``),
the serving options (``options``) and what answers say of the served package
(``served_package``).
"""
