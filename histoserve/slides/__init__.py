"""Slides in: open a whole-slide image, find its mpp, plan its tiles, know which slide it is.

Readers (:mod:`~histoserve.slides.readers`, CZI and DICOM beside it, the
native JPEG-TIFF reader in :mod:`~histoserve.slides.tiff`), resampling, the
Series UID of a DICOM file, a slide's identity for resume, the tile grid in
microns, the manifest and shards (which slides a run takes) and per-slide
bulk RNA counts. Imports only the root modules (errors, limits, atomic) and
its own modules.
"""
