"""Binary masks to polygons and back, exactly, with numpy alone (no Python loop per pixel or edge).

:func:`mask_polygons` traces the boundary of a mask along pixel edges (no
marching-squares corner cutting): every vertex lies on the pixel grid, each
4-connected component of the mask becomes one polygon (outer ring and its
holes), and where two pixels touch only at a corner they are kept apart.
:func:`rasterize` fills polygons back by sampling every pixel at its centre
(nonzero winding with outer rings and holes oriented apart, so overlapping
polygons are a union and holes stay holes). Because a traced edge never
passes through a pixel centre, ``rasterize(mask_polygons(m))`` is ``m`` pixel
for pixel: a run's own QC contours fed back in as a mask give the same tissue
fractions, hence the same tiles.

Coordinates are ``(x, y)`` in mask pixels with ``(0, 0)`` the top-left corner
of pixel ``(row 0, col 0)``; callers scale them to level-0 pixels.

Rasterising a user's GeoJSON must not cost what its outlines ask: every
edge crosses one row centre per row it spans, and a zig-zag of long edges
on a large grid has 10^8 such crossings (held at once, gigabytes).
:func:`rasterize` sums them a band of rows and a chunk of crossings at a
time, so memory stays bounded; :func:`crossing_count` (cheap) is the work,
which callers bound before calling it (``limits.MAX_MASK_CROSSINGS``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

Ring = list[tuple[float, float]]  # closed: first point repeated last
Polygon = list[Ring]  # outer ring, then holes
RingLike = Ring | np.ndarray  # what rasterize takes: points or an [k, 2] array
# |coordinate| beyond which float64 edge arithmetic is no longer exact enough.
MAX_COORDINATE = 2.0**52
_BAND_PIXELS = 1 << 22  # winding counts of one row band: 16 MB of int32
_CHUNK_CROSSINGS = 1 << 19  # crossings computed at once: about 40 MB of temporaries

# Directed pixel sides, traversed clockwise on screen (y down): start and end
# corner offsets (dx, dy) from the pixel's top-left corner, and the neighbour
# (drow, dcol) that must be background for the side to be a boundary.
_SIDES = (
    ((0, 0), (1, 0), (-1, 0)),  # top
    ((1, 0), (1, 1), (0, 1)),  # right
    ((1, 1), (0, 1), (1, 0)),  # bottom
    ((0, 1), (0, 0), (0, -1)),  # left
)


def _boundary_edges(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every boundary side: start corners ``[E, 2]`` (x, y), end corners, owning pixel index."""
    h, w = mask.shape
    padded = np.pad(mask, 1)
    starts, ends, owners = [], [], []
    for (sx, sy), (ex, ey), (dr, dc) in _SIDES:
        neighbour = padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w]
        rows, cols = np.nonzero(mask & ~neighbour)
        starts.append(np.stack([cols + sx, rows + sy], axis=1))
        ends.append(np.stack([cols + ex, rows + ey], axis=1))
        owners.append(rows * w + cols)
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(owners)


def _successors(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """The edge that follows each edge; at a corner shared by two diagonal pixels,
    the one of the same pixel (so each ring stays within one 4-connected component).
    Every edge has exactly one predecessor: the result is a permutation."""
    width = int(max(starts[:, 0].max(), ends[:, 0].max())) + 1
    start_keys = starts[:, 1] * width + starts[:, 0]
    end_keys = ends[:, 1] * width + ends[:, 0]
    order = np.argsort(start_keys, kind="stable")
    lo = np.searchsorted(start_keys[order], end_keys, "left")
    hi = np.searchsorted(start_keys[order], end_keys, "right")
    first = order[lo]
    second = order[np.minimum(lo + 1, len(order) - 1)]
    take_second = (hi - lo == 2) & (owners[second] == owners)
    return np.where(take_second, second, first)


def _cycles(successor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cycles of a permutation by pointer doubling: elements in walking order
    (each cycle from its smallest element) and the cycle id of each, in that order."""
    n = len(successor)
    rounds = int(np.ceil(np.log2(max(n, 2)))) + 1
    cycle, jump = np.arange(n), successor.copy()
    for _ in range(rounds):
        cycle = np.minimum(cycle, cycle[jump])
        jump = jump[jump]
    # Steps from each element to the last of its cycle (the one before the smallest).
    last = successor == cycle
    steps = np.where(last, 0, 1)
    nxt = np.where(last, np.arange(n), successor)
    for _ in range(rounds):
        steps = steps + steps[nxt]
        nxt = nxt[nxt]
    order = np.lexsort((-steps, cycle))
    return order, cycle[order]


def _rings(mask: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Every boundary ring (corner points ``[k, 2]``, straight runs merged) and its first owner."""
    starts, ends, owners = _boundary_edges(mask)
    order, cycle = _cycles(_successors(starts, ends, owners))
    points = starts[order]
    bounds = np.flatnonzero(np.diff(cycle)) + 1
    first = np.concatenate([[0], bounds])
    last = np.concatenate([bounds, [len(order)]]) - 1
    ring_of = np.repeat(np.arange(len(first)), last - first + 1)
    index = np.arange(len(order))
    prev = np.where(index == first[ring_of], last[ring_of], index - 1)
    nxt = np.where(index == last[ring_of], first[ring_of], index + 1)
    into, out = points - points[prev], points[nxt] - points
    corner = into[:, 0] * out[:, 1] - into[:, 1] * out[:, 0] != 0
    rings = np.split(points[corner], np.flatnonzero(np.diff(ring_of[corner])) + 1)
    return rings, owners[order[first]]


def signed_area(ring: Sequence[tuple[float, float]] | np.ndarray) -> float:
    """Shoelace area; positive for the clockwise-on-screen outer rings traced here."""
    pts = np.asarray(ring, dtype=np.float64).reshape(-1, 2)
    x, y = pts[:, 0], pts[:, 1]
    wrap = x[-1] * y[0] - x[0] * y[-1]
    return float(((x[:-1] * y[1:] - x[1:] * y[:-1]).sum() + wrap) / 2.0)


def _closed(points: np.ndarray) -> Ring:
    ring = [(float(x), float(y)) for x, y in points.tolist()]
    return [*ring, ring[0]]


def mask_polygons(mask: np.ndarray) -> list[Polygon]:
    """The polygons of ``mask`` (bool ``[h, w]``): one per 4-connected component, holes kept.

    Returns:
        Polygons, each ``[outer, *holes]``, rings closed, in mask-pixel ``(x, y)``.
    """
    from scipy import ndimage

    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return []
    labels, _count = ndimage.label(mask)
    rings, owners = _rings(mask)
    ring_labels = labels.ravel()[owners]
    outers: dict[int, list[np.ndarray]] = {}
    holes: dict[int, list[np.ndarray]] = {}
    for ring, label in zip(rings, ring_labels.tolist(), strict=True):
        area = signed_area(ring)
        (outers if area > 0 else holes).setdefault(label, []).append((area, ring))
    polygons = []
    for label in sorted(outers):
        found = [ring for _area, ring in sorted(outers[label], key=lambda a: -a[0])]
        holes_of = [ring for _area, ring in holes.get(label, [])]
        polygons.append([_closed(found[0]), *(_closed(h) for h in holes_of)])
        polygons.extend([_closed(extra)] for extra in found[1:])
    return polygons


def boundary_edge_count(mask: np.ndarray) -> int:
    """Pixel sides between tissue and background or the mask's edge: what :func:`mask_polygons`
    traces (its memory is about 200 bytes a side)."""
    m = np.asarray(mask, dtype=bool)
    if m.size == 0:
        return 0
    inner = np.count_nonzero(m[:, 1:] != m[:, :-1]) + np.count_nonzero(m[1:] != m[:-1])
    return int(inner + m[0].sum() + m[-1].sum() + m[:, 0].sum() + m[:, -1].sum())


def coarsened(mask: np.ndarray, factor: int) -> np.ndarray:
    """``mask`` pooled by ``factor`` a side (a block is tissue when any pixel of it is)."""
    h, w = mask.shape
    rows, cols = -(-h // factor), -(-w // factor)
    padded = np.zeros((rows * factor, cols * factor), bool)
    padded[:h, :w] = mask
    return padded.reshape(rows, factor, cols, factor).any(axis=(1, 3))


def rasterize(polygons: Sequence[Sequence[RingLike]], shape: tuple[int, int]) -> np.ndarray:
    """Pixels of ``shape`` whose centre lies inside any polygon (holes excluded).

    Memory stays bounded whatever the polygons: winding counts are summed one
    band of rows at a time (``_BAND_PIXELS``) and the edge-row crossings of a
    band at most ``_CHUNK_CROSSINGS`` at a time. The time is linear in
    :func:`crossing_count`, which a caller bounds first.

    Args:
        polygons: ``[outer, *holes]`` rings of ``(x, y)`` in pixel units; rings
            may be open or closed, in either orientation.
        shape: ``(h, w)`` of the mask.

    Returns:
        bool ``[h, w]``.

    Raises:
        ValueError: A coordinate is not finite or beyond ``MAX_COORDINATE``.
    """
    h, w = shape
    out = np.zeros((h, w), bool)
    edges, flip = _edges(polygons)
    lo, hi = _row_spans(edges, h)
    keep = hi > lo
    edges, flip, lo, hi = edges[keep], flip[keep], lo[keep], hi[keep]
    band = max(1, _BAND_PIXELS // (w + 1))
    for r0 in range(0, h if len(edges) else 0, band):
        r1 = min(h, r0 + band)
        sel = np.flatnonzero((lo < r1) & (hi > r0))
        if not sel.size:
            continue
        first = np.maximum(lo[sel], r0)
        counts = np.minimum(hi[sel], r1) - first
        winding = np.zeros((r1 - r0) * (w + 1), np.int32)
        for part in _chunks(counts, _CHUNK_CROSSINGS):
            idx = sel[part]
            rows, cols, signs = _crossings(edges[idx], flip[idx], first[part], counts[part], w)
            np.add.at(winding, (rows - r0) * (w + 1) + cols, signs)
        band_winding = winding.reshape(r1 - r0, w + 1)
        out[r0:r1] = np.cumsum(band_winding, axis=1, dtype=np.int32)[:, :w] != 0
    return out


def crossing_count(polygons: Sequence[Sequence[RingLike]], height: int) -> int:
    """Edge-row crossings :func:`rasterize` computes on a grid ``height`` rows high (its work).

    Raises:
        ValueError: As :func:`rasterize`.
    """
    edges, _flip = _edges(polygons)
    lo, hi = _row_spans(edges, height)
    return int(np.maximum(hi - lo, 0).sum())


def _edges(polygons: Sequence[Sequence[RingLike]]) -> tuple[np.ndarray, np.ndarray]:
    """Every edge ``[E, 4]`` (x0, y0, x1, y1) and its sign: outer rings +1, holes -1.

    The sign is set whatever the ring's drawn orientation.
    """
    edges, orient = [], []
    for polygon in polygons:
        for i, ring in enumerate(polygon):
            pts = np.asarray(ring, dtype=np.float64).reshape(-1, 2)
            if len(pts) < 3:
                continue
            if not (np.isfinite(pts).all() and np.abs(pts).max() <= MAX_COORDINATE):
                raise ValueError(
                    f"polygon coordinates must be finite and within {MAX_COORDINATE:g}"
                )
            area = signed_area(pts)
            if area == 0:
                continue
            edges.append(np.concatenate([pts, np.roll(pts, -1, axis=0)], axis=1))
            want = 1.0 if i == 0 else -1.0
            orient.append(np.full(len(pts), want * np.sign(area)))
    if not edges:
        return np.zeros((0, 4)), np.zeros(0)
    return np.concatenate(edges), np.concatenate(orient)


def _row_spans(edges: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``[lo, hi)`` whose centre line each edge crosses, clipped to the grid."""
    y0, y1 = edges[:, 1], edges[:, 3]
    lo = np.clip(np.ceil(np.minimum(y0, y1) - 0.5), 0, h).astype(np.int64)
    hi = np.clip(np.ceil(np.maximum(y0, y1) - 0.5), 0, h).astype(np.int64)
    return lo, hi


def _chunks(counts: np.ndarray, limit: int) -> Iterator[slice]:
    """Consecutive slices of ``counts`` summing to at most ``limit`` (or one item above it)."""
    ends = np.cumsum(counts)
    start = 0
    while start < len(counts):
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + limit, "right")))
        yield slice(start, stop)
        start = stop


def _crossings(
    edges: np.ndarray, flip: np.ndarray, first: np.ndarray, counts: np.ndarray, w: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each edge crosses its ``counts`` rows from ``first``: row, column right of it, +-1."""
    x0, y0, x1, y1 = edges.T
    which = np.repeat(np.arange(len(edges)), counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = first[which] + offsets
    slope = (x1 - x0) / (y1 - y0)
    xs = x0[which] + (rows + 0.5 - y0[which]) * slope[which]
    cols = np.clip(np.ceil(xs - 0.5), 0, w).astype(np.int64)
    signs = (np.sign(y1 - y0) * flip).astype(np.int32)[which]
    return rows, cols, signs
