"""histoserve: a KServe predictor for histopathology tile models in AOTInductor ``.pt2`` packages.

Each layer is a folder (``server/``, ``serving/``, ``families/``, ``codecs/``,
``batching/``, ``device/``, ``package/``, ``export/``) and the client side is
``client/``; ``docs/architecture.md`` has the one layer map and walks one
request through them.

Importing the package does nothing else.
"""

__version__ = "0.1.0"
