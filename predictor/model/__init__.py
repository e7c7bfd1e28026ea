"""The served model: the seed's ``BaseServerModel`` and what runs around its hooks.

``base`` is the class a user subclasses (``from predictor import
BaseServerModel``) and KServe serves, one for every family: the lifecycle,
preprocess, predict, postprocess, and the seed's two hooks,
``prepare_sample`` and ``forward_batch(samples, requests, mode)``, which
hand over to the model's family. What a family is (its named hooks, one
``outputs(mode)``) is ``family``; the tile family's defaults (the embedding
backbone's) are ``tiles``. Around them:
admission and the queue bound (``admission``), the decode pool
(``stage1``), the JPEG decode place (``device_jpeg``), the batcher's call
(``forward``), non-finite outputs (``finite``), the server's metrics
(``metrics``) and what its devices hold (``device_stats``), the serving
options (``options``) and what answers say of the served package
(``served_package``).
"""
