"""Protocol codecs: client requests in, per-tile items out, and back.

Each module knows one wire format and nothing of scheduling or models;
:mod:`predictor.codecs.base` is the interface the model talks to
(``decode``, ``check_outputs``, ``encode``), met by
:class:`~predictor.codecs.v1.V1Codec` and :class:`~predictor.codecs.v2.V2Codec`:

* :mod:`predictor.codecs.images`: encoded tile bytes to ``uint8 [H, W, 3]``.
* :mod:`predictor.codecs.v2`: Open Inference Protocol (REST JSON, REST binary
  extension, gRPC) ``InferRequest`` to :class:`~predictor.codecs.samples.DecodedRequest`
  and results back to an ``InferResponse``.
* :mod:`predictor.codecs.binary`: our strict parser of the V2 binary tensor
  extension body (KServe's decodes ``BYTES`` as UTF-8 text).
* :mod:`predictor.codecs.v2_response`: per-tile results to a V2 response, and
  the ``InferResponse`` subclass that serialises numpy outputs without
  per-element Python work.
* :mod:`predictor.codecs.v1`: the V1 ``instances``/``predictions`` format.
* :mod:`predictor.codecs.tensors`, :mod:`predictor.codecs.common`: shared
  helpers (tensor data, base64, parameters).

Every client mistake becomes :class:`predictor.errors.InvalidInput` naming the
input, the tile and the reason. Importing this package, or any codec, imports
nothing heavy (no torch: a test checks it).
"""
