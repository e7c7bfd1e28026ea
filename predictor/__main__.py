"""``python -m predictor``: serve a model (see :mod:`predictor.cli`)."""

import sys

from predictor.cli import serve

if __name__ == "__main__":
    sys.exit(serve())
