"""``python -m predictor``: serve a model (see :mod:`predictor.cli`)."""

import gc
import sys

from predictor.cli import serve

if __name__ == "__main__":
    code = serve()
    # Drained and stopped: nothing is left to collect that matters. Freezing the
    # heap skips the full collections of interpreter shutdown, which on a busy
    # node took seconds after the drain (several hundred thousand objects).
    gc.freeze()
    sys.exit(code)
