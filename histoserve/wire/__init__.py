"""The V2 REST binary tensor extension: one writer and one reader, for clients and server.

A binary V2 body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw data of every tensor whose parameters carry
``binary_data_size``, in tensor order. Numeric data is little-endian and
row-major; a ``BYTES`` tensor is its elements, each a 4-byte little-endian
length then the bytes. The same layout serves requests (``inputs``) and
responses (``outputs``).

Everything that writes or reads that layout goes through this module, so a
fix to the format lands once: the Python clients, the benchmark's load
generator and the reliability suite, and the server, whose request parser
(:mod:`predictor.codecs.binary`) and ``BYTES`` splitter
(:mod:`predictor.codecs.tensors`) read with the functions below. Every refusal
is a :class:`WireError` (a :class:`ValueError`); the server turns it into a
400 at one place (:func:`predictor.codecs.tensors.reading_wire`), a client
sees a malformed server answer as the same error.

numpy only: the load generator imports this module in a process that must not
import torch or kserve. Numeric tensors are written with one ``tobytes`` and
read with ``np.frombuffer`` (no copy; the arrays are read-only views of the
body); only ``BYTES`` length prefixes are walked element by element.

The request parameter ``mode`` is declared here too (:mod:`histoserve.wire.modes`):
each kind of model's modes and the outputs each asks for, the one table the
server's families and the client's checks both read.
"""

from histoserve.wire.format import (
    DATATYPES,
    HEADER,
    MAX_HEADER_DIGITS,
    WireError,
    length_prefixed,
    split_length_prefixed,
)
from histoserve.wire.modes import (
    MASK_OUTPUTS,
    MODE_OUTPUTS,
    MODES,
    SLIDE_INPUT,
    SLIDE_MODE_OUTPUTS,
    SLIDE_MODES,
    SLIDE_OUTPUTS,
)
from histoserve.wire.read import (
    binary_slice,
    check_consumed,
    decode_response,
    header_length,
    read_header,
)
from histoserve.wire.write import (
    Tensor,
    binary_body,
    datatype_of,
    encode_request,
    encode_tensor,
    tensor_entry,
)

__all__ = [
    "DATATYPES",
    "HEADER",
    "MASK_OUTPUTS",
    "MAX_HEADER_DIGITS",
    "MODES",
    "MODE_OUTPUTS",
    "SLIDE_INPUT",
    "SLIDE_MODES",
    "SLIDE_MODE_OUTPUTS",
    "SLIDE_OUTPUTS",
    "Tensor",
    "WireError",
    "binary_body",
    "binary_slice",
    "check_consumed",
    "datatype_of",
    "decode_response",
    "encode_request",
    "encode_tensor",
    "header_length",
    "length_prefixed",
    "read_header",
    "split_length_prefixed",
    "tensor_entry",
]
