"""Binary masks to polygons and back, exactly, with numpy alone.

:func:`mask_polygons` traces the boundary of a mask along pixel edges (no
marching-squares corner cutting): every vertex lies on the pixel grid, each
4-connected component of the mask becomes one polygon (outer ring and its
holes), and where two pixels touch only at a corner they are kept apart.
:func:`rasterize` fills polygons back by sampling every pixel at its centre
(even-odd inside one polygon, union over polygons). Because a traced edge
never passes through a pixel centre, ``rasterize(mask_polygons(m))`` is ``m``
pixel for pixel: a run's own QC contours fed back in as a mask give the same
tissue fractions, hence the same tiles.

Coordinates are ``(x, y)`` in mask pixels with ``(0, 0)`` the top-left corner
of pixel ``(row 0, col 0)``; callers scale them to level-0 pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Ring = list[tuple[float, float]]  # closed: first point repeated last
Polygon = list[Ring]  # outer ring, then holes

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


def _link_rings(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> list[list[int]]:
    """Edges chained into closed rings (edge indices); at a corner shared by two
    diagonal pixels the ring stays with the pixel it arrived on."""
    outgoing: dict[tuple[int, int], list[int]] = {}
    for i, (x, y) in enumerate(starts.tolist()):
        outgoing.setdefault((x, y), []).append(i)
    end_list, owner_list = ends.tolist(), owners.tolist()

    def successor(edge: int) -> int:
        options = outgoing[tuple(end_list[edge])]
        same = [e for e in options if owner_list[e] == owner_list[edge]]
        return (same or options)[0]

    used = np.zeros(len(starts), bool)
    rings = []
    for first in range(len(starts)):
        if used[first]:
            continue
        ring, edge = [], first
        while not used[edge]:  # successor() is one-to-one: the walk comes back to first
            used[edge] = True
            ring.append(edge)
            edge = successor(edge)
        rings.append(ring)
    return rings


def _simplify(points: np.ndarray) -> Ring:
    """Drops the corners where the ring goes straight on; returns a closed ring."""
    prev, nxt = np.roll(points, 1, axis=0), np.roll(points, -1, axis=0)
    cross = (points[:, 0] - prev[:, 0]) * (nxt[:, 1] - points[:, 1]) - (
        points[:, 1] - prev[:, 1]
    ) * (nxt[:, 0] - points[:, 0])
    kept = points[cross != 0]
    ring = [(float(x), float(y)) for x, y in kept]
    return [*ring, ring[0]]


def signed_area(ring: Sequence[tuple[float, float]]) -> float:
    """Shoelace area; positive for the clockwise-on-screen outer rings traced here."""
    pts = np.asarray(ring, dtype=np.float64)
    x, y = pts[:, 0], pts[:, 1]
    return float((x[:-1] * y[1:] - x[1:] * y[:-1]).sum() / 2.0)


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
    starts, ends, owners = _boundary_edges(mask)
    outers: dict[int, list[Ring]] = {}
    holes: dict[int, list[Ring]] = {}
    for ring_edges in _link_rings(starts, ends, owners):
        ring = _simplify(starts[ring_edges])
        label = int(labels.ravel()[owners[ring_edges[0]]])
        (outers if signed_area(ring) > 0 else holes).setdefault(label, []).append(ring)
    polygons = []
    for label in sorted(outers):
        rings = sorted(outers[label], key=signed_area, reverse=True)
        polygons.append([rings[0], *holes.get(label, [])])
        polygons.extend([extra] for extra in rings[1:])
    return polygons


def rasterize(polygons: Sequence[Polygon], shape: tuple[int, int]) -> np.ndarray:
    """Pixels of ``shape`` whose centre lies inside any polygon (even-odd within each).

    Args:
        polygons: ``[outer, *holes]`` rings of ``(x, y)`` in pixel units; rings
            may be open or closed, in either orientation.
        shape: ``(h, w)`` of the mask.

    Returns:
        bool ``[h, w]``.
    """
    h, w = shape
    out = np.zeros((h, w), bool)
    for polygon in polygons:
        edges = _edges(polygon)
        if not len(edges):
            continue
        ys = edges[:, [1, 3]]
        r0 = max(0, int(np.ceil(ys.min() - 0.5)))
        r1 = min(h, int(np.ceil(ys.max() - 0.5)))
        if r1 > r0:
            out[r0:r1] |= _fill(edges, r0, r1, w)
    return out


def _edges(polygon: Polygon) -> np.ndarray:
    """The non-horizontal edges of every ring of ``polygon``: ``[E, 4]`` (x0, y0, x1, y1)."""
    parts = []
    for ring in polygon:
        pts = np.asarray(ring, dtype=np.float64).reshape(-1, 2)
        if len(pts) >= 3:
            parts.append(np.concatenate([pts, np.roll(pts, -1, axis=0)], axis=1))
    if not parts:
        return np.zeros((0, 4))
    edges = np.concatenate(parts)
    return edges[edges[:, 1] != edges[:, 3]]


def _fill(edges: np.ndarray, r0: int, r1: int, w: int) -> np.ndarray:
    """Rows ``r0:r1`` of one polygon by even-odd crossings of its edges with row centre lines."""
    x0, y0, x1, y1 = edges.T
    lo = np.clip(np.ceil(np.minimum(y0, y1) - 0.5), r0, r1).astype(np.int64)
    hi = np.clip(np.ceil(np.maximum(y0, y1) - 0.5), r0, r1).astype(np.int64)
    counts = hi - lo
    which = np.repeat(np.arange(len(edges)), counts)
    rows = lo[which] + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    xs = x0[which] + (rows + 0.5 - y0[which]) * (x1 - x0)[which] / (y1 - y0)[which]
    cols = np.clip(np.ceil(xs - 0.5), 0, w).astype(np.int64)
    toggles = np.zeros((r1 - r0, w + 1), np.int64)
    np.add.at(toggles, (rows - r0, cols), 1)
    return (np.cumsum(toggles, axis=1)[:, :w] % 2).astype(bool)
