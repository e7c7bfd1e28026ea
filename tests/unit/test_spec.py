"""Model specs: built-ins carry the vendor's facts; files load strictly; JSON round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.errors import SpecError
from predictor.spec import (
    BUILTIN_SPECS,
    METADATA_KEY,
    ModelSpec,
    load_spec_file,
    resolve_spec,
    spec_from_dict,
    spec_from_json,
)

ENCODER_MEAN = (0.707223, 0.578729, 0.703617)
ENCODER_STD = (0.211883, 0.230117, 0.177517)


def test_builtin_names() -> None:
    assert set(BUILTIN_SPECS) == {
        "h0-mini",
        "h0",
        "h1",
        "m-optimus",
        "tissue-seg",
        "abmil-demo",
        "mean-pool",
    }
    assert METADATA_KEY == "histoserve.spec"


@pytest.mark.parametrize("name", ["h0-mini", "h0", "h1"])
def test_tile_encoders_share_the_vendor_geometry(name: str) -> None:
    spec = BUILTIN_SPECS[name]
    assert spec.family == "embedding"
    assert (spec.tile_size, spec.patch_size, spec.prefix_tokens, spec.embedding_dim) == (
        224,
        14,
        1,
        1536,
    )
    assert spec.mean == ENCODER_MEAN and spec.std == ENCODER_STD
    assert spec.mpp == 0.5 and spec.interpolation == "bicubic" and spec.precision == "fp32"
    assert spec.default_mode == "embedding" and not spec.takes_bulk_rna


def test_multimodal_spec() -> None:
    spec = BUILTIN_SPECS["m-optimus"]
    assert spec.family == "multimodal" and spec.takes_bulk_rna
    assert spec.prefix_tokens == 5 and spec.tile_size == 224
    assert spec.bulk_rna_transform == "log1p" and spec.prediction_transform == "expm1"
    assert (spec.genes_in_file, spec.genes_out_file) == ("genes_in.csv", "genes_out.csv")
    assert spec.default_mode == "prediction"
    assert set(spec.modes) == {"prediction", "embedding", "prediction_with_embedding"}


def test_segmentation_spec() -> None:
    spec = BUILTIN_SPECS["tissue-seg"]
    assert spec.family == "segmentation"
    assert spec.tile_size == 512 and spec.mpp == 8.0
    assert spec.mean is None and spec.std is None  # plain /255
    assert spec.mask_threshold == 0.5


@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_json_roundtrip(name: str) -> None:
    spec = BUILTIN_SPECS[name]
    again = spec_from_json(spec.to_json())
    assert again == spec
    assert again.to_json() == spec.to_json()


def _custom(**changes: object) -> dict:
    data = BUILTIN_SPECS["h0-mini"].to_dict() | {"name": "custom", "embedding_dim": 768}
    return data | changes


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(_custom()))
    spec = load_spec_file(path)
    assert spec.name == "custom" and spec.embedding_dim == 768
    assert isinstance(spec.mean, tuple) and spec.mean == ENCODER_MEAN
    assert resolve_spec(str(path)) == spec


def test_load_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "seg.yaml"
    path.write_text(
        "name: my-seg\nfamily: segmentation\ntile_size: 256\nmean: null\nstd: null\n"
        "embedding_dim: 0\nmodes: [prediction]\nmpp: 4.0\n"
    )
    spec = resolve_spec(str(path))
    assert (spec.name, spec.family, spec.tile_size, spec.mpp) == (
        "my-seg",
        "segmentation",
        256,
        4.0,
    )
    assert spec.modes == ("prediction",)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_custom(embeding_dim=1)))
    with pytest.raises(SpecError, match="embeding_dim"):
        load_spec_file(path)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"family": ""}, "family"),
        ({"tile_size": 0}, "tile_size"),
        ({"mean": [0.5, 0.5]}, "mean"),
        ({"std": [1.0, 0.0, 1.0]}, "std"),
        ({"modes": []}, "modes"),
        ({"modes": ["embedding", "embedding"]}, "twice"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_values_name_the_value(changes: dict, needle: str) -> None:
    """What every spec has; the family part is the family's (``tests/unit/families``)."""
    with pytest.raises(SpecError, match=needle):
        spec_from_dict(_custom(**changes))


def test_the_spec_module_names_no_family_and_imports_no_torch() -> None:
    """Foundation: the families' names, modes and sections live in the families."""
    import subprocess
    import sys

    import predictor.spec

    assert not hasattr(predictor.spec, "FAMILIES")
    code = "import sys, predictor.spec; print(sorted({'torch', 'predictor.families'} & set(sys.modules)))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "[]"


def test_incomplete_spec() -> None:
    with pytest.raises(SpecError, match="incomplete"):
        spec_from_dict({"name": "x", "family": "embedding"})


@pytest.mark.parametrize(
    ("text", "needle"), [("{not json", "not valid JSON"), ("[1, 2]", "must be an object")]
)
def test_bad_json(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        spec_from_json(text)


@pytest.mark.parametrize(
    ("suffix", "text", "needle"),
    [
        (".json", "[" * 2000 + "]" * 2000, "is not valid JSON: .*(depth|recursion)"),
        (".yaml", "a: " + "[" * 2000 + "]" * 2000 + "\n", "nested too deep"),
        (".json", " " * (2 << 20) + "{}", "bytes; a spec is a few KB"),
    ],
    ids=["deep-json", "deep-yaml", "huge"],
)
def test_a_spec_file_too_deep_or_too_large_is_one_clear_error(
    tmp_path: Path, suffix: str, text: str, needle: str
) -> None:
    """A RecursionError traceback at start-up before (deep), read whole (huge)."""
    path = tmp_path / f"spec{suffix}"
    path.write_text(text)
    with pytest.raises(SpecError, match=needle) as caught:
        load_spec_file(path)
    assert str(path) in str(caught.value)


def test_bad_yaml_and_non_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec_file(bad)
    listing = tmp_path / "list.yml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec_file(listing)


def test_unknown_name_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown spec 'h9'"):
        resolve_spec("h9")
    with pytest.raises(SpecError, match="cannot read"):
        resolve_spec(str(tmp_path / "missing.json"))


def test_spec_is_immutable() -> None:
    spec = BUILTIN_SPECS["h0"]
    with pytest.raises(AttributeError):
        spec.embedding_dim = 3  # type: ignore[misc]
    assert isinstance(spec, ModelSpec)
