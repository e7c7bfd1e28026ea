"""The served model: the seed's ``BaseServerModel`` and what runs around its hooks.

``base`` is the class a user subclasses (``from predictor import
BaseServerModel``) and KServe serves: the lifecycle, preprocess, predict,
postprocess. Its two per-tile hooks, ``prepare_sample`` and
``forward_batch(samples, requests, mode)``, and the per-request ones are
declared with their defaults in ``hooks``; the class-level ones (a family's
package names, demo module, output check) in ``package_hooks``. Around them:
admission and the queue bound (``admission``), the decode pool
(``stage1``), the JPEG decode place (``device_jpeg``), the batcher's call
(``forward``), non-finite outputs (``finite``), the server's metrics
(``metrics``), the serving options (``options``) and what answers say of
the served package (``served_package``).
"""
