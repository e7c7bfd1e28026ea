"""``python -m predictor.export.build``."""

import sys

from predictor.export.build.build import main

if __name__ == "__main__":
    sys.exit(main())
