"""Slide-level models on the client side: a served slide head over tile features, and its pictures.

``histoserve aggregate FEATURES_DIR --url URL --model NAME`` (and
``histoserve embed --slide-model NAME``) send each slide's tile features to a
served ``slide`` model (an attention-MIL head) and write, beside the features,
its prediction, attention and slide embedding, ``slides.csv`` for the run,
and per slide a heatmap JPEG, the top tiles and a QuPath GeoJSON of the attention.

Modules, one job each: :mod:`~predictor.client.slides.sources` (feature files
of every layout, read back checked), :mod:`~predictor.client.slides.head`
(the served head's description, every answer checked),
:mod:`~predictor.client.slides.slide_head` (one slide: read, check, send,
write), :mod:`~predictor.client.slides.results` (the per-slide result file,
resume), :mod:`~predictor.client.slides.table` (``slides.csv``),
:mod:`~predictor.client.slides.pictures` (one slide's pictures, its top
tiles), :mod:`~predictor.client.slides.heatmap` (the heatmap JPEG),
:mod:`~predictor.client.slides.qupath` (the GeoJSON),
:mod:`~predictor.client.slides.aggregate` (the run: shard, claims, resume,
status), :mod:`~predictor.client.slides.embed_stage` (``embed
--slide-model``) and :mod:`~predictor.client.slides.cli`.

Importing this package imports nothing else (neither torch nor kserve, ever).
"""
