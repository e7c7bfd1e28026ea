"""``Retry-After``: the one parser of the client side (RFC 9110, section 10.2.3).

The header is either delta-seconds (``"3"``) or an HTTP-date
(``"Wed, 21 Oct 2015 07:28:00 GMT"``). Both clients (the tile client and
``histoserve embed``) read it here, so neither raises on a form the other
takes, and a malformed header never hides the error that carried it.
"""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value.

    Args:
        value: The header as received; None or empty when absent.
        now_s: The current time (seconds since the epoch) an HTTP-date is
            measured from; the wall clock when None.

    Returns:
        Seconds (``>= 0``; a date in the past is ``0.0``), or None when the
        header is absent, negative, not finite or neither form.
    """
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        return _seconds_until(text, time.time() if now_s is None else now_s)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until(text: str, now_s: float) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    return max(0.0, when.timestamp() - now_s)
