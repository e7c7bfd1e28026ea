"""One ``histoserve embed`` run, composed from the rooms below it.

Its options (:class:`~histoserve.embedding.config.EmbedConfig`), the run
(resume, claims, slides overlapping: :mod:`~histoserve.embedding.pipeline`),
one slide start to finish, reading ahead, progress, a served tissue model, the
slide-model stage and flat memory. Imports any room below; nothing below
imports it.
"""
