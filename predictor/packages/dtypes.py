"""The one dtype table of histoserve: package dtype names to torch dtypes.

Used by the exporter (``--dtype``), by the package metadata reader (the tile
input's recorded dtype) and by the device normaliser, so a name means the
same dtype everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

DTYPES: Mapping[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
"""Short names (the exporter's ``--dtype`` choices) to torch dtypes."""

_ALIASES: Mapping[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def dtype_from_name(name: str) -> torch.dtype:
    """``fp32``/``fp16``/``bf16``, ``float32``... or ``torch.float32``... to a torch dtype.

    Raises:
        ValueError: An unknown name; the message names it and the known ones.
    """
    key = str(name).removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(
            f"unknown dtype {name!r}; expected one of {sorted(DTYPES)} (or {sorted(_ALIASES)})"
        )
    return DTYPES[key]
