"""``qc/<id>.<model>.geojson``: every tile as a QuPath detection whose measurements are its attention.

QuPath imports a GeoJSON FeatureCollection (File > Import objects, or drag
and drop) and makes each Feature whose ``properties.objectType`` is
``"detection"`` a detection object; ``properties.measurements`` (a map of
name to number, as QuPath 0.4 and later write it) become its measurements,
and Measure > Show measurement maps colours the detections by any of them on
the full-resolution slide: the heatmap at every zoom, the way QuPath's
WSInfer extension shows tile results.

Each tile is a closed square ``Polygon`` in level-0 pixels (QuPath's image
coordinates). Its measurements: ``attention`` (one branch) or ``attention:
<class>`` per class, and ``attention percentile`` (of the drawn branch,
:func:`~histoserve.heads.heatmap.percentiles`), every value finite.
The whole collection carries the slide, model and prediction in its own
``properties`` (QuPath ignores them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np


def measurement_names(attention: np.ndarray, classes: Sequence[str]) -> list[str]:
    """The names of the attention measurements (``attention`` or ``attention: <class>``)."""
    if np.asarray(attention).ndim == 1:
        return ["attention"]
    n = np.asarray(attention).shape[1]
    return [f"attention: {classes[i] if i < len(classes) else f'class_{i}'}" for i in range(n)]


def detections(
    coords: np.ndarray,
    patch: int,
    attention: np.ndarray,
    percentile: np.ndarray,
    classes: Sequence[str],
    properties: dict[str, Any],
) -> dict[str, Any]:
    """The FeatureCollection (see the module docstring)."""
    att = np.asarray(attention, np.float64)
    columns = att.reshape(len(att), -1)
    names = measurement_names(att, classes)
    features = []
    for i, (x, y) in enumerate(np.asarray(coords, np.int64).reshape(-1, 2).tolist()):
        ring = [[x, y], [x + patch, y], [x + patch, y + patch], [x, y + patch], [x, y]]
        measurements = {n: float(v) for n, v in zip(names, columns[i].tolist(), strict=True)}
        measurements["attention percentile"] = float(percentile[i])
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "properties": {
                    "objectType": "detection",
                    "name": f"tile {i}",
                    "measurements": measurements,
                },
            }
        )
    return {"type": "FeatureCollection", "properties": properties, "features": features}


def dumps(collection: dict[str, Any]) -> str:
    """Compact JSON text (no NaN: every measurement is finite)."""
    return json.dumps(collection, separators=(",", ":"), allow_nan=False)
