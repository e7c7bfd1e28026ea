"""The console script ``histoserve``: ``embed``, ``aggregate``, ``serve`` and ``export``.

``embed`` and ``aggregate`` are the client's. ``serve`` (also: no command, or
flags only) and ``export`` are the server's, in the ``predictor`` package of
the same distribution: they are imported by name when run, so that the client
never imports the server. Each first checks that the ``server`` extra is
installed (:func:`histoserve.extras.server_extra_missing`: one line naming
what is missing, exit 2); ``serve`` does it in ``predictor.cli.serve``, which
``python -m predictor`` runs too.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from histoserve.extras import EXIT_SERVER_MISSING, server_extra_missing


def main(argv: Sequence[str] | None = None) -> int:
    """``histoserve serve ...``, ``export ...``, ``embed ...`` or ``aggregate ...``; plain flags mean serve."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in ("embed", "aggregate", "export", "serve") else None
    if command == "embed":
        from histoserve.commands.embed import main as embed_main

        return embed_main(argv[1:])
    if command == "aggregate":
        from histoserve.commands.aggregate import main as aggregate_main

        return aggregate_main(argv[1:])
    if command == "export":
        if server_extra_missing("export"):
            return EXIT_SERVER_MISSING
        return importlib.import_module("predictor.export.build").main(argv[1:])
    # `serve` checks the extra itself (`python -m predictor` runs it too)
    return importlib.import_module("predictor.cli").serve(argv[1:] if command else argv)
