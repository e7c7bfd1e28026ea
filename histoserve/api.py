"""The notebook API: ``histoserve.embed`` and ``histoserve.read_features``.

``histoserve embed`` is a thin layer over :func:`embed`: every flag is a
keyword argument of the same name (``--target-mpp`` is ``target_mpp``, a
repeatable flag such as ``--url`` takes one value or a list), with the same
defaults (the command line reads them from :func:`embed_defaults`), the same
checks and the same files written. Where the command line exits 2 or 1, the
function raises :class:`~histoserve.errors.UsageError` or
:class:`~histoserve.errors.EmbedError`; slides that fail are in the
summary's ``failed`` (and ``status.csv``), as they are for the command.
"""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from histoserve.embedding.config import EmbedConfig
from histoserve.errors import SlideError, UsageError
from histoserve.limits import DEFAULT_MAX_TILES_PER_SLIDE
from histoserve.remote.auth import load_credentials
from histoserve.slides.manifest import parse_shard

if TYPE_CHECKING:  # the run and the reader load on first call: `embed --help` needs neither
    from histoserve.embedding.pipeline import EmbedSummary
    from histoserve.results.sources import SlideFeatures

PathLike = Union[str, "os.PathLike[str]"]
# Options that take one value or several (the repeatable flags).
_SEVERAL = ("url", "tissue_url", "slide_url", "header")
# What each other option must be; None is allowed where it is the default.
_KINDS = {
    **dict.fromkeys(("out", "manifest", "masks", "ca_cert", "token_file"), "path"),
    **dict.fromkeys(
        (
            *("model", "mode", "progress", "layout", "tissue", "slide_model"),
            *("reader", "resize", "transport"),
        ),
        "text",
    ),
    **dict.fromkeys(("force", "qc", "trust_env"), "flag"),
    **dict.fromkeys(
        ("target_mpp", "mpp_override", "mpp_tolerance", "min_tissue", "timeout_s", "recycle_s"),
        "number",
    ),
    **dict.fromkeys(
        (
            "tile_size",
            "accept_bad_tiles",
            "overlap",
            "max_tiles_per_slide",
            "batch_size",
            "concurrency",
            "read_workers",
            "queue_batches",
            "slides_in_flight",
            "max_attempts",
            "recycle_requests",
        ),
        "whole number",
    ),
}
_IS_KIND = {
    "path": lambda v: isinstance(v, (str, os.PathLike)),
    "text": lambda v: isinstance(v, str),
    "flag": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "whole number": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
}


def embed(
    slides: PathLike | Iterable[PathLike] = (),
    *,
    url: str | Sequence[str],
    out: PathLike,
    manifest: PathLike | None = None,
    model: str | None = None,
    mode: str = "embedding",
    force: bool = False,
    shard: str | tuple[int, int] | None = None,
    progress: str = "auto",
    ca_cert: PathLike | None = None,
    token_file: PathLike | None = None,
    trust_env: bool = False,
    header: str | Sequence[str] = (),
    layout: str = "flat",
    target_mpp: float | None = None,
    tile_size: int | None = None,
    mpp_override: float | None = None,
    mpp_tolerance: float = 0.05,
    tissue: str = "otsu",
    tissue_url: str | Sequence[str] = (),
    min_tissue: float = 0.25,
    masks: PathLike | None = None,
    accept_bad_tiles: int = 0,
    qc: bool = True,
    overlap: int = 0,
    reader: str = "auto",
    resize: str = "bicubic",
    transport: str = "auto",
    slide_model: str | None = None,
    slide_url: str | Sequence[str] = (),
    max_tiles_per_slide: int = DEFAULT_MAX_TILES_PER_SLIDE,
    batch_size: int = 64,
    concurrency: int = 0,
    read_workers: int = 0,
    queue_batches: int = 0,
    slides_in_flight: int = 2,
    max_attempts: int = 8,
    timeout_s: float = 300.0,
    recycle_requests: int = 1000,
    recycle_s: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> EmbedSummary:
    """Embeds ``slides`` (and the ``manifest``'s) with the model served at ``url`` into ``out``.

    Every option is ``histoserve embed``'s flag of the same name (README,
    "Embedding whole slides"); ``shard`` is ``"I/N"``, ``"N"`` or ``"auto"``
    as on the command line, or an ``(I, N)`` pair. ``env`` is where
    ``$HISTOSERVE_TOKEN`` and the shard index are read (default: this
    process's environment).

    Returns:
        The run's summary: ``done``, ``skipped`` and ``failed`` slide ids (``failed``:
        id -> reason), tiles and seconds; a resumed run skips what is done.

    Interrupting it (Ctrl-C, a notebook's stop button) starts no further slide
    waits for the slides in progress (``slides_in_flight``) to be
    finished, then raises KeyboardInterrupt; every file is whole or absent, and a re-run resumes.

    Raises:
        UsageError: A bad option, found before any slide is read; an ``out`` made with
            other settings (without ``force``).
        EmbedError: The server cannot be reached or described.
    """
    options = {name: value for name, value in locals().items() if name != "env"}
    from histoserve.embedding.pipeline import embed as run_embed

    return run_embed(embed_config(options, os.environ if env is None else env))


def embed_defaults() -> dict[str, Any]:
    """Each option of :func:`embed` with its default: the command line's defaults too."""
    parameters = inspect.signature(embed).parameters.values()
    return {
        p.name: p.default
        for p in parameters
        if p.default is not inspect.Parameter.empty and p.name != "env"
    }


def embed_config(options: Mapping[str, Any], env: Mapping[str, str]) -> EmbedConfig:
    """The checked :class:`EmbedConfig` of :func:`embed`'s options (UsageError when bad).

    Types are checked first, by name and type only: an option's value may be a
    credential (a header, a URL), so no message repeats it.
    """
    defaults = embed_defaults()
    for name, kind in _KINDS.items():
        value = options[name]
        if not (value is None and defaults.get(name, 0) is None) and not _IS_KIND[kind](value):
            raise UsageError(f"{name}: expected a {kind}, got {type(value).__name__}")
    several = {name: _several(name, options[name]) for name in _SEVERAL}
    own = {*_SEVERAL, "slides", "out", "shard", "ca_cert", "token_file", "trust_env"}
    config = {k: v for k, v in options.items() if k not in own}
    return EmbedConfig(
        **config,
        urls=several["url"],
        out_dir=Path(options["out"]),
        slides=_paths(options["slides"]),
        tissue_urls=several["tissue_url"],
        slide_urls=several["slide_url"],
        shard=_shard(options["shard"], env),
        credentials=load_credentials(
            options["ca_cert"],
            options["token_file"],
            several["header"],
            env,
            options["trust_env"],
        ),
    )


def read_features(path: PathLike) -> SlideFeatures:
    """One slide's features file of any layout, read back and checked.

    ``path`` is a features ``.h5`` (``flat``, ``trident``, ``clam``'s
    ``h5_files/``, or TRIDENT's and CLAM's own), or a CLAM ``pt_files/<id>.pt``,
    read from its ``h5_files/<id>.h5`` (the same features, with their coords).

    Returns:
        ``features`` ``[N, D]``, ``coords`` ``[N, 2]`` (level-0 top-left x, y),
        ``attrs`` (the file's attributes: model, mpp, slide identity...),
        ``patch_level0`` and ``extent``.

    Raises:
        SlideError: ``"<path>: <reason>"``: not there, not a regular file, not a
            features file, marked incomplete, rows that disagree, non-finite values.
    """
    path = Path(path)
    if path.suffix == ".pt":
        if path.parent.name != "pt_files":
            raise SlideError(f"{path}: a .pt file is read from CLAM's pt_files/ folder only")
        path = path.parent.parent / "h5_files" / f"{path.stem}.h5"
    from histoserve.results.sources import read_features as read_h5

    return read_h5(path)


def _several(name: str, value: Any) -> tuple[str, ...]:
    """One value or several: a lone string is one value, never its characters."""
    values = _items(name, value, (str,), "a string or a list of strings")
    return tuple(str(v) for v in values)


def _paths(value: Any) -> tuple[Path, ...]:
    """Slide paths: one path-like, or a list or any iterable (a glob) of them."""
    return tuple(Path(v) for v in _items("slides", value, (str, os.PathLike), "a path or paths"))


def _items(name: str, value: Any, kinds: tuple[type, ...], wanted: str) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, kinds):
        return (value,)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(f"{name}: expected {wanted}, got {type(value).__name__}")
    items = tuple(value)
    for index, item in enumerate(items):
        if not isinstance(item, kinds):
            raise UsageError(f"{name}: expected {wanted}, item {index} is {type(item).__name__}")
    return items


def _shard(value: Any, env: Mapping[str, str]) -> tuple[int, int] | None:
    """``"I/N"``, ``"N"`` or ``"auto"`` as on the command line, or an ``(I, N)`` pair."""
    if value is None or isinstance(value, str):
        return parse_shard(value, env)
    pair = tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(pair) != 2 or not all(_IS_KIND["whole number"](v) for v in pair):
        raise UsageError("shard: expected 'I/N', 'N', 'auto' or an (I, N) pair of whole numbers")
    return parse_shard(f"{pair[0]}/{pair[1]}", env)
