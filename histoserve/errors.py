"""Client-side errors of ``histoserve embed``, and what each one means for a run.

::

    EmbedError                 base of every error the embed client raises on purpose
    ├── UsageError             the command line or manifest is wrong: exit status 2, nothing embedded
    └── SlideError             this slide fails alone (``failed`` in status.csv); the others go on

Messages say what is wrong *and* how to fix it (which flag or manifest column),
because they end up in ``status.csv`` read by someone who did not write the code.
Third-party errors (OpenSlide, tifffile, h5py) are wrapped with ``raise ... from``.
"""

from __future__ import annotations


class EmbedError(Exception):
    """Base of client-side embed errors."""


class UsageError(EmbedError):
    """Bad usage (``--shard``, no slides, a bad manifest): the run stops with exit status 2."""


class SlideError(EmbedError):
    """This slide cannot be embedded; the message says why and how to fix it."""
