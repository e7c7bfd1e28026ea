"""The console script ``histoserve`` and its command lines, thin layers over :mod:`histoserve.api`.

``embed`` and ``aggregate`` parse flags into the API's keyword arguments;
``serve`` and ``export`` are the server's (``predictor``), reached by name
only when run, with one clear line when the ``server`` extra is missing.
"""
