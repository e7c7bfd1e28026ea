"""JSON read from outside, parsed only once it is known to be bounded in bytes and nesting.

Python's ``json`` parser recurses once per level of nesting: a ``[`` repeated
about 1,000 times (a few KB) raises :class:`RecursionError`, which no caller
expects from "bad JSON", and a file's size is whatever the file says. Every
JSON the project reads from a file, an HDF5 attribute or a server (the run
record, QC facts, a done file's ``slide_identity``, recorded settings, a
server's model config, a spec file) goes through :func:`loads`: its size
first, then its nesting counted without parsing (strings skipped, brackets
summed, all at C speed), then ``json.loads``. Any failure is one
:class:`JsonError` naming the source and the limit, which each caller turns
into its own refusal (a usage error, a failed or re-embedded slide, a 400).

Pure Python. The server imports it too (spec files): beside the wire format
and the extras check, the one module it takes from the client package.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

# Nesting (arrays and objects): the project's records are at most 6 deep, a
# model spec or a KServe model config 5, a GeoJSON FeatureCollection 8;
# Python's parser gives up near 1,000 (its recursion limit).
MAX_JSON_DEPTH = 64
# Bytes of one JSON text unless the caller bounds it tighter: the largest the
# project reads (a run record listing every slide's settings, a server's
# model config) are kilobytes; 16 MiB parses in well under a second.
MAX_JSON_BYTES = 16 << 20

_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\[\s\S][^"\\]*)*"')
_STRING_TEXT = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*"')
_NOT_BRACKETS_TEXT = re.compile(r"[^\[\]{}]+")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_STEP_TEXT = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonError(ValueError):
    """JSON that is too large, too deep or not JSON; the message names its source and why."""


def depth(data: bytes | str) -> int:
    """The deepest nesting of arrays and objects in ``data``, counted without parsing.

    Brackets inside strings do not count; an unterminated string's do (the
    count is never below what a parser would recurse). Linear, C speed.
    """
    if isinstance(data, str):
        brackets: Any = _NOT_BRACKETS_TEXT.sub("", _STRING_TEXT.sub("", data))
        steps = map(_STEP_TEXT.__getitem__, brackets)
    else:
        brackets = _STRING_BYTES.sub(b"", data).translate(None, _NOT_BRACKETS)
        steps = map(_STEP.__getitem__, brackets)
    return max(itertools.accumulate(steps, initial=0))


def loads(
    data: bytes | bytearray | memoryview | str,
    where: str,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """``data`` parsed as JSON, once its size and nesting are within bounds.

    ``where`` names the source in messages (a file, ``slide_identity`` of a
    file, a URL). Bytes are decoded as UTF-8 (a BOM is allowed).

    Raises:
        JsonError: Over ``max_bytes``, nested deeper than ``max_depth``, not
            UTF-8, or not JSON; the message names ``where`` and the limit.
    """
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise JsonError(f"{where} is {size:,} bytes of JSON, more than the {max_bytes:,} allowed")
    deepest = depth(data)
    if deepest > max_depth:
        raise JsonError(
            f"{where} is JSON nested {deepest} deep, more than the {max_depth} allowed "
            "(not a file this program wrote)"
        )
    try:
        text = data if isinstance(data, str) else data.decode("utf-8-sig")
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise JsonError(f"{where} is not UTF-8 text (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise JsonError(
            f"{where} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except RecursionError as exc:  # a caller deep in its own stack; never from the bound above
        raise JsonError(f"{where} is JSON nested too deep to parse here") from exc
