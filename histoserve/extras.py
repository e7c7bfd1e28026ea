"""Whether the ``server`` extra is installed: asked where ``serve`` and ``export`` start.

``pip install histoserve`` is the client side only; ``histoserve serve``,
``python -m predictor`` and ``histoserve export`` need ``histoserve[server]``
(torch, kserve, ...). Standard library only, below both the client's commands
and the server's command line, which each ask it before importing anything
heavy.
"""

from __future__ import annotations

import importlib.util
import sys

EXIT_SERVER_MISSING = 2
# What `histoserve serve` and `histoserve export` need beyond the client side.
SERVER_MODULES = ("torch", "kserve", "yaml", "prometheus_client")


def server_extra_missing(command: str) -> bool:
    """Whether the ``server`` extra is missing; if so, says so on stderr in one line.

    Looks the modules up without importing them: the line names each one
    missing and ``install histoserve[server]``.
    """
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"histoserve {command}: {', '.join(missing)} not installed:"
            " install histoserve[server] (pip install 'histoserve[server]')",
            file=sys.stderr,
        )
    return bool(missing)
