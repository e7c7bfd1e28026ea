"""``python -m predictor.export``: the export CLI (:func:`predictor.export.build.main`).

The Makefile's ``make serve`` and the docs run this module; ``histoserve
export`` and ``python -m predictor.export.build`` reach the same ``main``.
"""

import sys

from predictor.export.build import main

if __name__ == "__main__":
    sys.exit(main())
