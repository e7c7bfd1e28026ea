"""The one dtype table of histoserve: package dtype names to torch dtypes.

Used by the exporter (``--dtype``), by the package metadata reader (the tile
input's recorded dtype) and by the device normaliser, so a name means the
same dtype everywhere. The table holds names only (torch's own, ``float32``),
so reading a package's facts does not import torch; :func:`dtype_from_name`
imports it when it hands out a torch dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES: Mapping[str, str] = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
}
"""Short names (the exporter's ``--dtype`` choices) to torch's names of the dtypes."""

_ALIASES: Mapping[str, str] = {torch_name: short for short, torch_name in DTYPES.items()}


def short_dtype_name(name: str) -> str:
    """``fp32`` of ``fp32``, ``float32`` or ``torch.float32`` (likewise fp16, bf16).

    Raises:
        ValueError: An unknown name; the message names it and the known ones.
    """
    key = str(name).removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(
            f"unknown dtype {name!r}; expected one of {sorted(DTYPES)} (or {sorted(_ALIASES)})"
        )
    return key


def dtype_from_name(name: str) -> torch.dtype:
    """``fp32``/``fp16``/``bf16``, ``float32``... or ``torch.float32``... to a torch dtype.

    Raises:
        ValueError: An unknown name; the message names it and the known ones.
    """
    import torch

    return getattr(torch, DTYPES[short_dtype_name(name)])
