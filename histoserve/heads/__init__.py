"""Slide heads: a served slide-level model (attention MIL) over each slide's features.

``histoserve aggregate`` and ``embed --slide-model``: what the served head
takes and answers, one slide sent and checked, its result file beside the
features, ``slides.csv``, and its pictures (heatmap JPEG, top tiles, QuPath
GeoJSON). Imports ``results/``, ``remote/``, ``tissue/``, ``slides/`` and the
root modules.
"""
