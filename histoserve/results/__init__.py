"""Results out: per-slide HDF5 files in a layout, committed whole, resumed only when still true.

The HDF5 feature file, the ``flat`` / ``trident`` / ``clam`` layouts and
their sibling files, claims (one process per slide), ``status.csv``, and
feature files read back checked (:mod:`~histoserve.results.sources`). Imports
``slides/``, the root modules and its own modules.
"""
