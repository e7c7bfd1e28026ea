"""Building ``.pt2`` packages: ``python -m predictor.export`` (``histoserve export``)."""
