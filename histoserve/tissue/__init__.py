"""Where the tissue is: a thumbnail mask found by a method, or a mask file a person drew.

Detection (:mod:`~histoserve.tissue.detect`), mask files (GeoJSON from
QuPath, PNG) and exact polygon <-> raster conversion. Imports ``slides/``,
the root modules and its own modules.
"""
