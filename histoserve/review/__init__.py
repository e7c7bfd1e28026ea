"""What a person checks before trusting a run: per-slide QC files and ``report.html``.

Imports every room below it (``heads/`` for ``slides.csv``), never
``embedding/``.
"""
