"""Building ``.pt2`` packages: ``python -m predictor.export.build`` (``histoserve export``)."""
