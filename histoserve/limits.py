"""What one slide may ask of ``histoserve embed``: every size a user or a file gives, bounded.

A slide, a mask file or a number on the command line decides how much work
and memory a slide takes; each is checked against a limit here *before* that
work starts, so a bad input fails its slide (or the command, for a flag) with
a message naming the input and the limit, never the run, and never after
hours or gigabytes. One constant per limit, with the figure that justifies it,
so messages, docs (``docs/cohorts.md``, "Limits") and tests quote one number:

- microns per pixel (flags, manifest, metadata): :data:`PLAUSIBLE_MPP`;
- a slide: its physical size (:data:`MAX_SLIDE_EDGE_MM`) and level-0 pixels
  (:data:`MAX_SLIDE_PIXELS`), its planned tiles
  (``--max-tiles-per-slide``, :data:`DEFAULT_MAX_TILES_PER_SLIDE`), the square
  read for one tile (:data:`MAX_READ_PX`), the pixels
  of its tissue thumbnail (:data:`MAX_THUMB_PIXELS`: coarser, never larger);
- a TIFF's directories: tiles and pages (:data:`MAX_TIFF_TILES`,
  :data:`MAX_TIFF_PAGES`), a tile's edge (:data:`MAX_TIFF_TILE_PX`), shared
  JPEG tables (:data:`MAX_JPEG_TABLES_BYTES`); a ``--transport jpeg`` request's
  bytes (:data:`MAX_JPEG_BYTES_PER_TILE`, :data:`MAX_JPEG_REQUEST_BYTES`);
- a JSON file or attribute the client reads: :data:`MAX_JSON_BYTES`,
  :data:`~histoserve.jsonsafe.MAX_JSON_DEPTH`;
- a mask file: bytes, JSON nesting, vertices, coordinates, the work of
  rasterising it, decoded pixels (``MAX_MASK_*``); a mask's QC contours
  (:data:`MAX_CONTOUR_EDGES`).

Pure Python (no numpy): the command line's checks import it before anything else.
"""

from __future__ import annotations

import math

# Microns per pixel of a real scan lie here: 0.01 um/px is past any optical
# microscope (the diffraction limit is ~0.2 um); 20 um/px is a 0.5x overview.
# Outside it a value is a unit slip (mm given for um: 1e-4), a writer's default
# (72 dpi is 352.8 um/px) or garbage. Flags, the manifest's mpp column and the
# slide's metadata are all held to it.
PLAUSIBLE_MPP = (0.01, 20.0)

# The largest glass slides pathology scans are 75 x 50 mm (3 x 2 in, the large
# format; the standard slide is 75 x 25 mm, ISO 8037-1); whole-mount research
# slides reach about 5 x 7 in (127 x 178 mm). A slide whose level 0 times its
# mpp is longer than this on an edge is not a scan of glass: a wrong mpp or a
# hostile header (2^20 px at 0.5 um/px is 524 mm).
MAX_SLIDE_EDGE_MM = 250.0
# Level-0 pixels, whatever the mpp says: the large format at 0.25 um/px (40x)
# is 300,000 x 200,000 px, 6e10; 2^37 (1.4e11) leaves twice that. Beyond it a
# slide without a pyramid would take hours just to read its thumbnail.
MAX_SLIDE_PIXELS = 1 << 37

# Planned tiles (the grid over the scanned area, before tissue is looked at).
# A 75 x 50 mm slide is 300,000 tiles of 112 um (224 px at 0.5 um/px) and
# 1.2 million at 0.25 um/px; 2 million leaves margin over any real slide and
# stops a wrong --target-mpp or tile size before it plans (and reads) more.
DEFAULT_MAX_TILES_PER_SLIDE = 2_000_000

# Edge of the square read for one tile (px at the read level): a target mpp
# far coarser than any level of the slide (20 um/px from a 0.25 um/px slide
# without a pyramid is 17,920 px, 1.3 GB a tile) is refused; 4096 px (64 MB
# of RGBA) is 18 times the tile, more than a pyramid's 4x steps ever need.
MAX_READ_PX = 4096

# A TIFF tile the native reader decodes (px an edge, as the TIFF declares it
# and as its JPEG must say too): scanners write 240-1024 px tiles; a larger
# declared size is a broken or hostile file, refused before any byte is read.
MAX_TIFF_TILE_PX = 4096

# TIFF directories, checked from the tags before any reader opens the slide
# (OpenSlide's open builds a record per tile: 16.7 M declared tiles of a 4 KiB
# sparse file took it 114 s and 674 MB). A 75 x 50 mm slide at 0.25 um/px in
# 240 px tiles is 1.04 M tiles at level 0 and 1.4 M with its pyramid; 2^22
# (4.2 M) is three times that. Pages: an SVS has 4-8, an NDPI about 10, a
# multiplexed QPTIFF a few hundred.
MAX_TIFF_TILES = 1 << 22
MAX_TIFF_PAGES = 4096

# A level's shared JPEG tables (tag 347, copied into every tile the native
# reader decodes or sends): quantisation and Huffman tables take 300-600
# bytes, 16-bit tables and four components about 2 KB; beyond 64 KiB the tag
# carries padding (COM segments), and the slide is read by OpenSlide instead.
MAX_JPEG_TABLES_BYTES = 64 << 10
# What one --transport jpeg request may carry, known from the tiles' byte counts
# before a byte is read: a model tile's slide tiles take 10-100 KB on a real
# slide (1 MiB is seven 224 px tiles of raw pixels), and a request stays under
# half the server's default 256 MiB body cap. A batch over either is sent as
# pixels.
MAX_JPEG_BYTES_PER_TILE = 1 << 20
MAX_JPEG_REQUEST_BYTES = 128 << 20

# The tissue thumbnail (Otsu, the "none" grid, GeoJSON rasterising, QC picture,
# a served tissue model's input) has at most this many pixels: 2^25 is 96 MiB
# of RGB and about 500 MB at the tissue mask's peak. At 4 um/px it covers
# 23 x 23 mm, most slides; a larger slide gets a coarser thumbnail (mpp raised
# by an integer factor), never a larger one.
MAX_THUMB_PIXELS = 1 << 25

# Mask files (--masks, the manifest's mask column).
# Bytes read at most: a 1-million-vertex QuPath export is 20-60 MB (compact
# or pretty-printed); an image mask is far smaller.
MAX_MASK_BYTES = 64 << 20
# GeoJSON nesting (objects and arrays): a FeatureCollection of MultiPolygons
# with QuPath's properties is 8 deep; Python's JSON parser gives up near 1000.
MAX_MASK_NESTING = 32
# Vertices over every feature: tissue annotations have thousands, QuPath's
# tissue detection on a large slide tens of thousands.
MAX_MASK_VERTICES = 1_000_000
# JSON values (numbers, strings, arrays, objects) a GeoJSON mask may hold,
# counted before parsing: a vertex is three (its array and two numbers), so a
# mask at the vertex cap fits, and parsing can never build more than this
# (a maximal mask peaks near 0.5 GB while parsed, whatever its byte size).
MAX_MASK_JSON_VALUES = 4 * MAX_MASK_VERTICES
# |x| and |y| in level-0 px: no slide is a billion pixels wide (250 mm at
# 0.25 um/px is 1e6); beyond this a coordinate is garbage, not a position.
MAX_MASK_COORDINATE = 1e9
# Work of rasterising (edge-row crossings on the thumbnail grid, each a few
# tens of ns): real outlines cross about as many rows as their perimeter in
# thumbnail px (10^5-10^6); this many takes ~6 s and means zig-zag or
# self-crossing outlines.
MAX_MASK_CROSSINGS = 100_000_000
# Decoded pixels of an image mask, read from its header before decoding (a
# 28 KB PNG can hold 15,000 x 11,250 px): the thumbnail's budget.
MAX_MASK_PIXELS = MAX_THUMB_PIXELS
# Boundary sides a tissue mask may have for its QC contours (about 200 bytes
# each while traced): a real slide's outlines have 10^4-10^5; a noisy mask
# (an image mask of speckle, a served model's noise) is traced coarser.
MAX_CONTOUR_EDGES = 1 << 20


# Upper bounds of the numeric options: beyond them a value is a typo (or
# infinity), and would overflow a timer or exhaust threads rather than help.
MAX_SECONDS = 86_400.0
MAX_BATCH = 4096
MAX_ATTEMPTS = 100
MAX_THREADS = 1024
MAX_SLIDES_IN_FLIGHT = 64
MAX_COUNT = 1 << 31
MAX_PRIORITY = 1 << 32
BULK_PRIORITY = 2
"""The class of service a cohort run asks for unless told (the server's bulk class)."""


def mpp_problem(value: float) -> str | None:
    """Why ``value`` is not a plausible microns per pixel, or None when it is."""
    low, high = PLAUSIBLE_MPP
    if not (math.isfinite(value) and low <= value <= high):
        return (
            f"{value:g} um/px is outside {low:g}..{high:g} um/px (a unit slip? "
            "0.25 um/px is 40x, 0.5 um/px is 20x)"
        )
    return None
