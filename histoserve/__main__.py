"""``python -m histoserve``: the console script (see :mod:`histoserve.commands.main`)."""

import sys

from histoserve.commands.main import main

if __name__ == "__main__":
    sys.exit(main())
