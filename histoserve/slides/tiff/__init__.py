"""TIFF slides read at the byte level: truncation checks and the native JPEG-TIFF reader.

:mod:`~histoserve.slides.tiff.checks` refuses a TIFF copied short before any
backend opens it; :mod:`~histoserve.slides.tiff.native` reads JPEG-tiled
TIFF and Aperio SVS directly (tile bytes from the file, libjpeg-turbo), with
OpenSlide's numbers and pixels; :mod:`~histoserve.slides.tiff.jpeg_tiles`
turns one TIFF tile into a whole JPEG stream and decodes it as OpenSlide
does; :mod:`~histoserve.slides.tiff.wire_tiles` gathers a batch's slide tiles
for ``--transport jpeg``. Imports only the root modules (errors, limits) and its own modules.
"""
