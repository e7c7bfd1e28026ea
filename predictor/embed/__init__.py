"""``histoserve embed``: whole slides in, one HDF5 file of tile features per slide out.

Python API (the CLI is a thin layer over it)::

    from predictor.embed import EmbedConfig, embed

    summary = embed(EmbedConfig(urls=("http://localhost:8080",), out_dir=Path("features"),
                                slides=(Path("slide.svs"),)))
    summary.done, summary.failed          # slide ids

Modules, one job each. The local side: :mod:`~predictor.embed.errors`,
:mod:`~predictor.embed.manifest` (inputs, shards), :mod:`~predictor.embed.slides`
(OpenSlide / tiffslide, mpp), :mod:`~predictor.embed.grid` (tile plan, reads),
:mod:`~predictor.embed.tissue`, :mod:`~predictor.embed.output` (HDF5,
status.csv, resume), :mod:`~predictor.embed.claims`. The remote side:
:mod:`~predictor.embed.config` (every option), :mod:`~predictor.embed.remote`
(what the server serves), :mod:`~predictor.embed.transport` /
:mod:`~predictor.embed.grpc_transport` (one URL), :mod:`~predictor.embed.dispatch`
(several URLs, retries), :mod:`~predictor.embed.batches` (reading ahead,
requests, assembly), :mod:`~predictor.embed.slide_job` (one slide),
:mod:`~predictor.embed.tissue_remote` (a served tissue model),
:mod:`~predictor.embed.pipeline` (the run: resume, claims, status),
:mod:`~predictor.embed.progress`, :mod:`~predictor.embed.memory` (big buffers
back to the OS), :mod:`~predictor.embed.bulk_rna`, :mod:`~predictor.embed.cli`.

Importing this package imports neither torch nor kserve (names below load on
first use): ``tritonclient.grpc`` and kserve register the same protobuf
symbols and cannot share a process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EmbedConfig", "EmbedError", "EmbedSummary", "SlideError", "UsageError", "embed"]

_WHERE = {
    "EmbedConfig": "predictor.embed.config",
    "EmbedError": "predictor.embed.errors",
    "SlideError": "predictor.embed.errors",
    "UsageError": "predictor.embed.errors",
    "EmbedSummary": "predictor.embed.pipeline",
    "embed": "predictor.embed.pipeline",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'predictor.embed' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
