"""What shapes a run's files, declared once: the folder's settings and each slide's resume hash.

:data:`RUN_SETTINGS` lists every setting of a run that changes what a file
holds. From it come three things that therefore cannot disagree:

- the output folder's settings record (:mod:`~histoserve.results.run_record`,
  ``<out>/.histoserve-run.json``): :func:`run_settings`, every declared key;
- each slide's resume hash (``config_hash``): :func:`slide_settings`, the
  same values plus what belongs to one slide (manifest mpp, bulk RNA, mask,
  tissue algorithm), a value equal to its ``omit`` default left out so hashes
  made before the setting existed stay as they were;
- the check of a folder made before the settings file existed
  (:func:`check_done_files`): what each done file's attributes record.

A new setting (``--reader``, ``--resize``) is one line here: with an
``omit`` default equal to today's behaviour, earlier folders and hashes
stay valid. A setting that is an option of ``histoserve embed`` names it by
its field (:func:`_option`): its flag and value come from the option's one
declaration (:data:`~histoserve.embedding.config.EMBED_OPTIONS`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from histoserve import jsonsafe
from histoserve.embedding.config import EMBED_OPTIONS
from histoserve.embedding.slide_job import RunContext
from histoserve.errors import UsageError
from histoserve.results.output import COMPLETE_ATTR, read_h5
from histoserve.slides.grid import interpolation_of
from histoserve.slides.identity import file_sha256
from histoserve.slides.manifest import SlideEntry
from histoserve.tissue.detect import OTSU_VERSION
from histoserve.tissue.masks import mask_file

RUN_SETTINGS_ATTR = "run_settings"  # every done file's copy of the folder's settings (JSON)
_NO_DEFAULT = object()


@dataclass(frozen=True)
class Setting:
    """One setting that changes what a file holds.

    Attributes:
        key: Its name in the settings record and in the resume hash.
        label: How messages name it (with its flag).
        value: Its value in a run.
        omit: A value left out of the resume hash, and what an absent key means
            in a record or a file (a setting added later: its old behaviour).
        attr: The done file's attribute that records it (folders older than
            the settings file are checked by it); None: none does.
    """

    key: str
    label: str
    value: Callable[[RunContext], Any]
    omit: Any = _NO_DEFAULT
    attr: str | None = None


def _tissue_package(ctx: RunContext) -> str:
    return ctx.tissue_info.package_sha256 if ctx.tissue_info else ""


def _interpolation(ctx: RunContext) -> str:
    return interpolation_of(ctx.info.spec, ctx.info.model)


def _option(
    key: str, name: str, value: Callable[[RunContext], Any] | None = None, **more: Any
) -> Setting:
    """The setting of a declared option: labelled with its flag, by default its config value."""
    (declared,) = (o for o in EMBED_OPTIONS if o.field == key)
    value = value or (lambda c: getattr(c.config, key))
    return Setting(key, f"{name} ({declared.flag})", value, **more)


# fmt: off
RUN_SETTINGS: tuple[Setting, ...] = (
    Setting("model", "model", lambda c: c.info.model, attr="model"),
    Setting("package_sha256", "package digest", lambda c: c.info.package_sha256,
            attr="package_sha256"),
    _option("target_mpp", "target mpp", lambda c: c.target_mpp, attr="target_mpp"),
    _option("tile_size", "tile size", lambda c: c.tile_size, attr="tile_size"),
    _option("mode", "mode", attr="mode"),
    _option("tissue", "tissue", attr="tissue"),
    Setting("tissue_package", "tissue model's package digest", _tissue_package),
    _option("min_tissue", "minimum tissue", attr="min_tissue"),
    _option("mpp_override", "mpp override"),
    _option("mpp_tolerance", "mpp tolerance"),
    Setting("resize_interpolation", "resize interpolation (the model's spec)", _interpolation),
    # `omit` is the behaviour before the setting existed, never tied to today's default
    _option("layout", "layout", omit="flat"),
    _option("overlap", "overlap", omit=0, attr="overlap"),
    _option("reader", "slide reader", omit="auto", attr="reader"),
    _option("resize", "resize", omit="bicubic", attr="resize"),
    # the file's ``transport`` attribute is the one a slide took, not the option
    _option("transport", "transport", omit="auto"),
)
# fmt: on
_BY_KEY = {s.key: s for s in RUN_SETTINGS}


def run_settings(ctx: RunContext) -> dict[str, Any]:
    """Every declared setting's value in this run, as JSON gives it back (the record)."""
    values = {s.key: s.value(ctx) for s in RUN_SETTINGS}
    return json.loads(json.dumps(values, default=str))


def slide_settings(ctx: RunContext, entry: SlideEntry) -> dict[str, Any]:
    """Everything that shapes a slide's output: its config hash is made of these.

    The run's settings (an ``omit`` value left out) and the slide's own.

    Raises:
        SlideError: ``--masks`` has no mask for the slide.
    """
    settings = {
        s.key: value
        for s in RUN_SETTINGS
        if (value := s.value(ctx)) != s.omit or s.omit is _NO_DEFAULT
    }
    mask = mask_file(entry.slide_id, entry.mask, ctx.config.masks)
    settings["manifest_mpp"] = entry.mpp
    settings["bulk_rna_sha256"] = file_sha256(entry.bulk_rna) if entry.bulk_rna else ""
    if ctx.config.tissue == "otsu" and mask is None:
        settings["tissue_algorithm"] = OTSU_VERSION
    if mask is not None:  # only then: hashes of runs without masks stay as they were
        settings["mask_sha256"] = file_sha256(mask)
    return settings


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``label: old -> new`` for each setting that differs, declared ones first.

    A key absent on one side means its ``omit`` value (a setting added later);
    a key unknown here (a record from a later histoserve) is compared as is.
    """
    keys = [s.key for s in RUN_SETTINGS] + sorted((set(old) | set(new)) - set(_BY_KEY))
    out = []
    for key in keys:
        setting = _BY_KEY.get(key)
        default = setting.omit if setting else _NO_DEFAULT
        was, now = old.get(key, default), new.get(key, default)
        if was != now:
            out.append(f"{setting.label if setting else key}: {_shown(was)} -> {_shown(now)}")
    return out


def _shown(value: Any) -> str:
    return "(none)" if value is _NO_DEFAULT or value is None else str(value)


def check_done_files(out_dir: Path, settings: Mapping[str, Any]) -> None:
    """UsageError unless every done file in ``out_dir`` agrees with ``settings``.

    For a folder without a settings record (made by a histoserve before it,
    or the record deleted): each done file of any layout (flat
    ``<id>.h5``, CLAM ``h5_files/``, TRIDENT ``*/features_*/``) is compared
    on what it records: its copy of the run's settings, else the attributes
    older files carry (model, package digest, target mpp, tile size, mode,
    tissue, minimum tissue, overlap) and the layout its place says.
    Settings no old file records (mpp tolerance, ...) are checked by each
    slide's resume hash instead: such a slide is embedded again.
    """
    for path, layout in _done_files(Path(out_dir)):
        recorded = read_h5(path, _recorded, (OSError, KeyError, ValueError, TypeError))
        if recorded is None:
            continue  # not a complete histoserve file: never taken for done either
        recorded.setdefault("layout", layout)
        diff = differences(recorded, {k: v for k, v in settings.items() if k in recorded})
        if diff:
            raise UsageError(
                f"--out {out_dir} has no settings record, and {path} was made with other "
                f"settings: {'; '.join(diff)} (old -> this run). Give another --out, or pass "
                "--force to embed every slide again with this run's settings"
            )


def _recorded(f: Any) -> dict[str, Any] | None:
    attrs = f.attrs
    if not bool(attrs.get(COMPLETE_ATTR, False)) or "config_hash" not in attrs:
        return None
    if RUN_SETTINGS_ATTR in attrs:
        where = f"{f.filename}: {RUN_SETTINGS_ATTR}"
        recorded = jsonsafe.loads(_text(attrs[RUN_SETTINGS_ATTR]), where)
        return recorded if isinstance(recorded, dict) else None
    out = {}
    for s in RUN_SETTINGS:
        if s.attr is not None and (s.attr in attrs or s.omit is not _NO_DEFAULT):
            value = attrs.get(s.attr, s.omit)
            out[s.key] = json.loads(json.dumps(_text(value), default=_plain))
    return out


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)


def _done_files(out: Path) -> Iterator[tuple[Path, str]]:
    """Every layout's done files (:meth:`~histoserve.results.layouts.Layout.done_file`)."""
    patterns = (
        ("*.h5", "flat"),
        ("h5_files/*.h5", "clam"),
        ("*/features_*/*.h5", "trident"),
        ("features_*/*.h5", "trident"),  # ``out`` is a TRIDENT coords folder
    )
    for pattern, layout in patterns:
        for path in sorted(out.glob(pattern)):
            if not path.name.startswith("."):
                yield path, layout
