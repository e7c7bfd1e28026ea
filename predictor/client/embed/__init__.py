"""``histoserve embed``: whole slides in, one HDF5 file of tile features per slide out.

Python API (the CLI is a thin layer over it)::

    from predictor.client.embed import EmbedConfig, embed

    summary = embed(EmbedConfig(urls=("http://localhost:8080",), out_dir=Path("features"),
                                slides=(Path("slide.svs"),)))
    summary.done, summary.failed          # slide ids

Modules, one job each. The local side: :mod:`~predictor.client.embed.errors`,
:mod:`~predictor.client.embed.manifest` (inputs, shards, slide ids),
:mod:`~predictor.client.embed.limits` (every input limit), :mod:`~predictor.client.embed.slides`
(OpenSlide / tiffslide, mpp), :mod:`~predictor.client.embed.grid` (tile plan, reads),
:mod:`~predictor.client.embed.tissue`, :mod:`~predictor.client.embed.masks` /
:mod:`~predictor.client.embed.mask_geojson` / :mod:`~predictor.client.embed.contours`
(mask files, contours), :mod:`~predictor.client.embed.output` (HDF5),
:mod:`~predictor.client.embed.layouts` (flat, trident, clam),
:mod:`~predictor.client.embed.siblings` (a layout's other files, by digest),
:mod:`~predictor.client.embed.atomic` (temp files, renames, no symlink followed),
:mod:`~predictor.client.embed.status` (status.csv), :mod:`~predictor.client.embed.identity`
and :mod:`~predictor.client.embed.dicom_header` (which slide a done file was made from),
:mod:`~predictor.client.embed.claims`, :mod:`~predictor.client.embed.text` (terminal and
spreadsheet-safe text), :mod:`~predictor.client.embed.qc`, :mod:`~predictor.client.embed.report`.
The remote side: :mod:`~predictor.client.embed.config` (every option),
:mod:`~predictor.client.embed.auth` (credentials), :mod:`~predictor.client.embed.remote`
(what the server serves), :mod:`~predictor.client.embed.transport` /
:mod:`~predictor.client.embed.grpc_transport` (one URL), :mod:`~predictor.client.embed.answers`
(every answer checked), :mod:`~predictor.client.embed.dispatch`
(several URLs, retries), :mod:`~predictor.client.embed.batches` (reading ahead,
requests, assembly), :mod:`~predictor.client.embed.slide_job` (one slide),
:mod:`~predictor.client.embed.tissue_remote` (a served tissue model),
:mod:`~predictor.client.embed.pipeline` (the run: resume, claims, status),
:mod:`~predictor.client.embed.progress`, :mod:`~predictor.client.embed.memory` (big buffers
back to the OS), :mod:`~predictor.client.embed.bulk_rna`, :mod:`~predictor.client.embed.cli`.
This folder is over the ten modules a folder should hold: it is split into rooms
(slides in, servers, results out, seeing) in the move to ``histoserve/``.

Importing this package imports neither torch nor kserve (names below load on
first use): ``tritonclient.grpc`` and kserve register the same protobuf
symbols and cannot share a process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EmbedConfig", "EmbedError", "EmbedSummary", "SlideError", "UsageError", "embed"]

_WHERE = {
    "EmbedConfig": "predictor.client.embed.config",
    "EmbedError": "predictor.client.embed.errors",
    "SlideError": "predictor.client.embed.errors",
    "UsageError": "predictor.client.embed.errors",
    "EmbedSummary": "predictor.client.embed.pipeline",
    "embed": "predictor.client.embed.pipeline",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'predictor.client.embed' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
