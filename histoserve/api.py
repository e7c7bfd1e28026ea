"""The notebook API: ``histoserve.embed`` and ``histoserve.read_features``.

``histoserve embed`` is a thin layer over :func:`embed`: every flag is a
keyword argument of the same name (``--target-mpp`` is ``target_mpp``, a
repeatable flag such as ``--url`` takes one value or a list), with the same
defaults, the same checks and the same files written: both are made from
one declaration per option (:mod:`histoserve.options.declare`). Where the command line exits 2 or 1, the
function raises :class:`~histoserve.errors.UsageError` or another
:class:`~histoserve.errors.HistoserveError` (a server that cannot be reached
is a :class:`~histoserve.errors.RemoteError`); slides that fail are in the
summary's ``failed`` (and ``status.csv``), as they are for the command.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from histoserve.embedding.config import EMBED_OPTIONS, CredentialOptions, EmbedConfig
from histoserve.errors import SlideError, UsageError
from histoserve.options.declare import IS_KIND, Option
from histoserve.remote.auth import load_credentials
from histoserve.slides.manifest import parse_shard

if TYPE_CHECKING:  # the run and the reader load on first call: `embed --help` needs neither
    from histoserve.embedding.pipeline import EmbedSummary
    from histoserve.results.sources import SlideFeatures

PathLike = Union[str, "os.PathLike[str]"]
# How the generated signature shows each kind of option.
_ANNOTATIONS = {
    "path": "PathLike",
    "text": "str",
    "flag": "bool",
    "number": "float",
    "whole number": "int",
    "several": "str | Sequence[str]",
    "paths": "PathLike | Iterable[PathLike]",
    "shard": "str | tuple[int, int]",
}


def embed(
    slides: PathLike | Iterable[PathLike] = (),
    *,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> EmbedSummary:
    """Embeds ``slides`` (and the ``manifest``'s) with the model served at ``url`` into ``out``.

    Every option is ``histoserve embed``'s flag of the same name (README,
    "Embedding whole slides"), declared once with its default and kind
    (:data:`histoserve.embedding.config.EMBED_OPTIONS`; this function's
    signature is made from it); ``shard`` is ``"I/N"``, ``"N"`` or ``"auto"``
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
        TypeError: An unknown keyword, or ``url`` or ``out`` missing (as for any function).
        UsageError: A bad option, found before any slide is read; an ``out`` made with
            other settings (without ``force``).
        RemoteError: The server cannot be reached or described.
    """
    try:
        bound = embed.__signature__.bind(slides, env=env, **options)  # type: ignore[attr-defined]
    except TypeError as exc:
        raise TypeError(f"embed() {exc}") from None
    bound.apply_defaults()
    given = {name: value for name, value in bound.arguments.items() if name != "env"}
    from histoserve.embedding.pipeline import embed as run_embed

    return run_embed(embed_config(given, os.environ if env is None else env))


def _none_allowed(declared: Option) -> bool:
    """None is a value only where it is the default."""
    return not declared.required and declared.default is None


def _signature() -> inspect.Signature:
    """:func:`embed`'s signature: ``slides``, then every declared option by keyword, then ``env``."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.signature(embed).parameters["slides"]]
    for o in EMBED_OPTIONS:
        if o.keyword != "slides":
            default = inspect.Parameter.empty if o.required else o.default
            annotation = _ANNOTATIONS[o.kind] + (" | None" if _none_allowed(o) else "")
            parameters.append(
                inspect.Parameter(o.keyword, keyword, default=default, annotation=annotation)
            )
    parameters.append(inspect.signature(embed).parameters["env"])
    return inspect.signature(embed).replace(parameters=parameters)


embed.__signature__ = _signature()  # type: ignore[attr-defined]


def embed_defaults() -> dict[str, Any]:
    """Each option of :func:`embed` with its default: the command line's defaults too."""
    return {o.keyword: o.default for o in EMBED_OPTIONS if not o.required}


def embed_config(options: Mapping[str, Any], env: Mapping[str, str]) -> EmbedConfig:
    """The checked :class:`EmbedConfig` of :func:`embed`'s options (UsageError when bad).

    Each option is checked by its declared kind first, by name and type only:
    an option's value may be a credential (a header, a URL), so no message
    repeats it.
    """
    values = {}
    for o in EMBED_OPTIONS:
        value = options[o.keyword]
        if o.kind == "several":
            value = _several(o.keyword, value)
        elif o.kind == "paths":
            value = _paths(value)
        elif o.kind == "shard":
            value = _shard(value, env)
        elif not (value is None and _none_allowed(o)) and not IS_KIND[o.kind](value):
            raise UsageError(f"{o.keyword}: expected a {o.kind}, got {type(value).__name__}")
        values[o.field] = value
    credentials = CredentialOptions(
        **{f.name: values.pop(f.name) for f in fields(CredentialOptions)}
    )
    return EmbedConfig(
        **values,
        credentials=load_credentials(
            credentials.ca_cert,
            credentials.token_file,
            credentials.header,
            env,
            credentials.trust_env,
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
    if len(pair) != 2 or not all(IS_KIND["whole number"](v) for v in pair):
        raise UsageError("shard: expected 'I/N', 'N', 'auto' or an (I, N) pair of whole numbers")
    return parse_shard(f"{pair[0]}/{pair[1]}", env)
