"""The one number format of ``results.md`` and the other benchmark tables."""

from __future__ import annotations

from typing import Any


def number(value: Any, digits: int = 1) -> str:
    """``value`` to ``digits`` decimals; "–" when it was not measured (``None``).

    Anything that is not a float (an int count, a label) is written as is.
    """
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
