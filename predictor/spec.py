"""Model specs: the facts a served model is built on.

A :class:`ModelSpec` says what a package expects (tile geometry, normalisation,
input transforms) and what it returns (output dims, modes). Seven specs are
built in (``h0-mini``, ``h0``, ``h1``, ``m-optimus``, ``tissue-seg`` and the
slide heads ``abmil-demo`` and ``mean-pool``); others load from a JSON or
YAML file. A spec travels inside its ``.pt2`` package as
JSON under :data:`METADATA_KEY`, so a package describes itself.

This module checks what every spec has. Its family part (the family name,
the modes the family answers, the fields that are the family's section) is
the family's: the registry checks it through the family
(:func:`predictor.families.family_for`), a layer above this one; every
model, export and probe gets its family there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from predictor.errors import SpecError

# A spec file's bytes: a spec is under 2 KB; a spec with thousands of class names stays far below.
MAX_SPEC_BYTES = 1 << 20

METADATA_KEY = "histoserve.spec"

_ENCODER_MEAN = (0.707223, 0.578729, 0.703617)
_ENCODER_STD = (0.211883, 0.230117, 0.177517)


@dataclass(frozen=True)
class ModelSpec:
    """What a model expects and returns.

    The fields marked with a family below are that family's section (the
    family declares them, its ``SPEC_FIELDS``, and checks them): a spec of
    another family leaves them at their defaults.

    Attributes:
        name: Spec name; the default model name in URLs.
        family: One of the registry's families
            (:data:`predictor.families.FAMILIES`), whose hooks serve it.
        tile_size: Tile edge in pixels (tiles are square RGB).
        mean: Per-channel mean applied after ``/255``; ``None`` means 0.
        std: Per-channel std applied after ``/255``; ``None`` means 1.
        embedding_dim: Floats per tile in the embedding output (0: none).
        modes: Modes the model answers, from its family's; the first is the default.
        hf_repo: Where the vendor publishes the weights.
        mpp: Microns per pixel the model was trained at.
        patch_size: ViT patch size (informational).
        prefix_tokens: ViT prefix tokens (informational).
        interpolation: Resize interpolation the vendor used (informational).
        precision: Reference precision (informational).
        bulk_rna_transform: Multimodal: ``log1p`` or ``None``, applied to raw bulk RNA.
        prediction_transform: Multimodal: ``expm1`` or ``None``, applied to predictions.
        prediction_decimals: Multimodal: rounding of transformed predictions.
        genes_in_file: Multimodal: CSV of input gene IDs beside the checkpoint.
        genes_out_file: Multimodal: CSV of output gene IDs beside the checkpoint.
        mask_threshold: Segmentation: sigmoid threshold for masks.
        version: Spec version string.
        feature_dim: Slide family: width ``D`` of the tile features it takes.
        classes: Slide family: class names, one per ``prediction`` entry.
        tile_encoder: Slide family: the tile encoder whose features it takes.
        tile_encoder_sha256: Slide family: that encoder's package digest, when known.
    """

    name: str
    family: str
    tile_size: int
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    embedding_dim: int
    modes: tuple[str, ...]
    hf_repo: str = ""
    mpp: float = 0.5
    patch_size: int | None = 14
    prefix_tokens: int = 1
    interpolation: str = "bicubic"
    precision: str = "fp32"
    bulk_rna_transform: str | None = None
    prediction_transform: str | None = None
    prediction_decimals: int = 3
    genes_in_file: str | None = None
    genes_out_file: str | None = None
    mask_threshold: float = 0.5
    version: str = "1"
    extra: Mapping[str, Any] = field(default_factory=dict)
    feature_dim: int = 0
    classes: tuple[str, ...] = ()
    tile_encoder: str = ""
    tile_encoder_sha256: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("spec name must not be empty")
        if not self.family:
            raise SpecError(f"spec {self.name!r}: family must not be empty")
        if self.tile_size <= 0:
            raise SpecError(f"spec {self.name!r}: tile_size must be > 0, got {self.tile_size}")
        for label, triple in (("mean", self.mean), ("std", self.std)):
            if triple is not None and len(triple) != 3:
                raise SpecError(f"spec {self.name!r}: {label} needs 3 values, got {triple!r}")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise SpecError(f"spec {self.name!r}: std values must be > 0, got {self.std!r}")
        if not self.modes or not all(isinstance(m, str) and m for m in self.modes):
            raise SpecError(f"spec {self.name!r}: modes {self.modes!r} must be one or more names")
        if len(set(self.modes)) != len(self.modes):
            raise SpecError(f"spec {self.name!r}: modes {list(self.modes)} name a mode twice")

    @property
    def default_mode(self) -> str:
        """The mode a request gets when it names none."""
        return self.modes[0]

    @property
    def takes_bulk_rna(self) -> bool:
        """Whether requests may carry a ``bulk_rna`` vector per tile."""
        return self.family == "multimodal"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :func:`spec_from_dict` reads it back."""
        data = dataclasses.asdict(self)
        data["extra"] = dict(self.extra)
        return data

    def to_json(self) -> str:
        """Compact JSON, as embedded in package metadata."""
        return json.dumps(self.to_dict(), sort_keys=True)


def spec_from_dict(data: Mapping[str, Any]) -> ModelSpec:
    """Builds a spec from a mapping, rejecting unknown keys by name."""
    known = {f.name for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"unknown spec keys {unknown}; known keys are {sorted(known)}")
    values = dict(data)
    for key in ("mean", "std"):
        if values.get(key) is not None:
            values[key] = tuple(float(v) for v in values[key])
    for key in ("modes", "classes"):
        if key in values:
            values[key] = tuple(values[key])
    try:
        return ModelSpec(**values)
    except TypeError as exc:
        raise SpecError(f"incomplete spec: {exc}") from exc


def spec_from_json(text: str, where: str = "spec") -> ModelSpec:
    """Reads a spec from its JSON form (e.g. package metadata); ``where`` names it in messages.

    Bounded before parsing: :data:`MAX_SPEC_BYTES`, and orjson's own nesting
    limit (1,024, in C: never Python's ``RecursionError``).
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{where} is {size:,} bytes of JSON; a spec is a few KB")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"spec JSON must be an object, got {type(data).__name__}")
    return spec_from_dict(data)


def load_spec_file(path: Path) -> ModelSpec:
    """Loads a spec from a ``.json`` or ``.yaml``/``.yml`` file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"spec file {path} is not UTF-8 text (byte {exc.start})") from exc
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"spec file {path} is over {MAX_SPEC_BYTES:,} bytes; a spec is a few KB")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"spec file {path} is not valid YAML: {exc}") from exc
        except RecursionError as exc:  # PyYAML composes nested nodes recursively
            raise SpecError(f"spec file {path} is nested too deep to be a spec") from exc
        if not isinstance(data, dict):
            raise SpecError(f"spec file {path} must hold a mapping")
        return spec_from_dict(data)
    return spec_from_json(text, str(path))


def resolve_spec(name_or_path: str) -> ModelSpec:
    """A built-in spec by name, or a spec file by path."""
    if name_or_path in BUILTIN_SPECS:
        return BUILTIN_SPECS[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".json", ".yaml", ".yml") or path.exists():
        return load_spec_file(path)
    raise SpecError(
        f"unknown spec {name_or_path!r}: not a built-in ({sorted(BUILTIN_SPECS)}) nor a spec file"
    )


def _encoder(name: str, repo: str, **kwargs: Any) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="embedding",
        tile_size=224,
        mean=_ENCODER_MEAN,
        std=_ENCODER_STD,
        embedding_dim=1536,
        modes=("embedding",),
        hf_repo=repo,
        **kwargs,
    )


def _slide_head(name: str, **kwargs: Any) -> ModelSpec:
    """A slide head over 1536-wide H-optimus features (H0-mini, H-optimus-0, H-optimus-1)."""
    return ModelSpec(
        name=name,
        family="slide",
        tile_size=224,
        mean=None,
        std=None,
        patch_size=None,
        prefix_tokens=0,
        feature_dim=1536,
        tile_encoder="h0-mini",
        **kwargs,
    )


BUILTIN_SPECS: Mapping[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _encoder(
            "h0-mini",
            "bioptimus/H0-mini",
            extra={"timm_kwargs": "mlp_layer=SwiGLUPacked,act_layer=SiLU", "pooling": "cls+mean"},
        ),
        _encoder(
            "h0",
            "bioptimus/H-optimus-0",
            extra={"timm_kwargs": "init_values=1e-5,dynamic_img_size=False"},
        ),
        _encoder(
            "h1",
            "bioptimus/H-optimus-1",
            extra={"timm_kwargs": "init_values=1e-5,dynamic_img_size=False"},
        ),
        ModelSpec(
            name="m-optimus",
            family="multimodal",
            tile_size=224,
            mean=_ENCODER_MEAN,
            std=_ENCODER_STD,
            embedding_dim=1536,
            modes=("prediction", "embedding", "prediction_with_embedding"),
            hf_repo="bioptimus/M-Optimus",
            prefix_tokens=5,
            bulk_rna_transform="log1p",
            prediction_transform="expm1",
            genes_in_file="genes_in.csv",
            genes_out_file="genes_out.csv",
        ),
        _slide_head(
            "abmil-demo",
            embedding_dim=512,
            modes=("prediction", "embedding", "attention"),
            classes=("class_0", "class_1"),
            extra={"architecture": "gated-attention ABMIL (Ilse et al., 2018), random weights"},
        ),
        _slide_head(
            "mean-pool",
            embedding_dim=1536,
            modes=("embedding", "attention"),
            extra={"architecture": "mean of the tile features, uniform attention, no weights"},
        ),
        ModelSpec(
            name="tissue-seg",
            family="segmentation",
            tile_size=512,
            mean=None,
            std=None,
            embedding_dim=0,
            modes=("prediction",),
            hf_repo="bioptimus/tissue-seg",
            mpp=8.0,
            patch_size=None,
            prefix_tokens=0,
        ),
    )
}
