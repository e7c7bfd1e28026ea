"""Loading a package and probing it: the loaded package against its eager module, each
family's probed shapes, one-line mismatches."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from harness.factories import WRONG_DIM_TARGET
from harness.packages import module_package
from predictor import families
from predictor.errors import CheckpointError, SpecMismatch
from predictor.families import build_demo_model, demo_example_inputs
from predictor.packages import metadata as pkg_meta
from predictor.runtime import loader, probe
from predictor.spec import BUILTIN_SPECS, spec_from_dict

CPU = torch.device("cpu")


def test_the_fallback_loader_refuses_several_instances(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where torch's private loader API differs, the public one builds one model copy only."""
    real = torch._C._aoti.AOTIModelPackageLoader
    calls: list[tuple] = []

    def changed_signature(*args: object) -> object:
        calls.append(args)
        if len(calls) == 1:  # our direct call: as if this torch's signature differed
            raise TypeError("incompatible function arguments (fake)")
        return real(*args)  # torch's own call, from the public aoti_load_package

    changed_signature.load_metadata_from_package = real.load_metadata_from_package  # type: ignore[attr-defined]
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", changed_signature)
    path = embedding_package_dir / "h0-mini.pt2"
    with pytest.raises(CheckpointError, match=r"--instances_per_device 2 needs .* use 1 instance"):
        loader.load_package(path, CPU, instances=2)
    assert len(calls) == 1
    calls.clear()
    loaded = loader.load_package(path, CPU, instances=1)
    assert len(calls) == 2
    assert loaded(torch.zeros(1, 3, 224, 224))[0].shape == (1, 1536)


# -- load, probe, consistency -------------------------------------------------------------
def test_loaded_package_matches_the_eager_module(embedding_package_dir: Path) -> None:
    loaded = loader.load_package(embedding_package_dir / "h0-mini.pt2", CPU)
    assert loaded.path.name == "h0-mini.pt2" and loaded.device == CPU
    assert loaded.input_dtype == torch.float32
    assert loaded.embedded_spec == BUILTIN_SPECS["h0-mini"]
    (tiles,) = demo_example_inputs(BUILTIN_SPECS["h0-mini"], 3, seed=11)
    out = loaded(tiles)
    assert isinstance(out, tuple) and len(out) == 1
    with torch.no_grad():
        expected = build_demo_model(BUILTIN_SPECS["h0-mini"])(tiles)
    torch.testing.assert_close(out[0], expected, rtol=1e-4, atol=1e-4)


def test_probe_and_consistency_per_family(
    embedding_package_dir: Path, multimodal_package_dir: Path, padded_segmentation_package_dir: Path
) -> None:
    cases = [
        (embedding_package_dir / "h0-mini.pt2", "h0-mini", (torch.Size([1536]),)),
        (
            multimodal_package_dir / "m-optimus.pt2",
            "m-optimus",
            (torch.Size([32]), torch.Size([1536])),
        ),
        (
            padded_segmentation_package_dir / "tissue-seg.pt2",
            "tissue-seg",
            (torch.Size([1, 512, 512]),),
        ),
    ]
    for path, name, expected in cases:
        loaded = loader.load_package(path, CPU)
        shapes = probe.probe_outputs(loaded, BUILTIN_SPECS[name], {})
        assert shapes == expected
        families.check_consistency(BUILTIN_SPECS[name], shapes)
    assert loaded(torch.zeros(3, 3, 512, 512))[0].shape[0] == 8  # padded: callers trim


def test_wrong_dim_package_is_a_one_line_mismatch() -> None:
    path = module_package("h0-mini", WRONG_DIM_TARGET)
    loaded = loader.load_package(path, CPU)
    shapes = probe.probe_outputs(loaded, BUILTIN_SPECS["h0-mini"], {})
    assert shapes == (torch.Size([768]),)
    with pytest.raises(SpecMismatch) as exc:
        families.check_consistency(BUILTIN_SPECS["h0-mini"], shapes)
    assert str(exc.value) == "spec 'h0-mini' says embedding_dim 1536 but the package returns 768"


def test_multimodal_gene_counts(multimodal_package_dir: Path) -> None:
    loaded = loader.load_package(multimodal_package_dir / "m-optimus.pt2", CPU)
    spec = BUILTIN_SPECS["m-optimus"]
    assert probe.declared_input_dim(loaded, "bulk_rna") == 64
    assert probe.declared_input_dim(loaded, "nope") is None
    shapes = probe.probe_outputs(loaded, spec, {"bulk_rna": 64})
    families.check_consistency(spec, shapes, prediction_dim=32)
    with pytest.raises(
        SpecMismatch, match="output gene list has 30 genes but the package predicts 32"
    ):
        families.check_consistency(spec, shapes, prediction_dim=30)
    with pytest.raises(SpecMismatch, match="60 input genes but the package takes 64"):
        probe.probe_outputs(loaded, spec, {"bulk_rna": 60})
    vendor_like = dataclasses.replace(
        loaded, metadata={k: v for k, v in loaded.metadata.items() if k != pkg_meta.INPUTS_KEY}
    )
    with pytest.raises(SpecMismatch, match="cannot tell the package's bulk RNA gene count"):
        probe.probe_outputs(vendor_like, spec, {})
    assert probe.probe_outputs(vendor_like, spec, {"bulk_rna": 64}) == shapes


def test_multimodal_package_handles_missing_bulk_rna(multimodal_package_dir: Path) -> None:
    loaded = loader.load_package(multimodal_package_dir / "m-optimus.pt2", CPU)
    spec = BUILTIN_SPECS["m-optimus"]
    tiles, bulk = demo_example_inputs(spec, 3, seed=5)
    assert bool(torch.isnan(bulk[-1]).all())
    prediction, embedding = loaded(tiles, bulk)
    assert bool(torch.isfinite(prediction).all()) and prediction.shape == (3, 32)
    with torch.no_grad():
        expected = build_demo_model(spec)(tiles, bulk)
    torch.testing.assert_close(prediction, expected[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(embedding, expected[1], rtol=1e-4, atol=1e-4)


def test_spec_and_package_inputs_disagree(
    embedding_package_dir: Path, segmentation_package_dir: Path
) -> None:
    loaded = loader.load_package(embedding_package_dir / "h0-mini.pt2", CPU)
    big = spec_from_dict(BUILTIN_SPECS["h0-mini"].to_dict() | {"name": "big", "tile_size": 448})
    with pytest.raises(
        SpecMismatch,
        match=r"input 'tiles' is \[-1, 3, 448, 448\] but the package takes \[-1, 3, 224, 224\]",
    ):
        probe.probe_outputs(loaded, big)
    with pytest.raises(SpecMismatch, match="feeds 2 input"):
        probe.probe_outputs(loaded, BUILTIN_SPECS["m-optimus"], {"bulk_rna": 64})
    seg = loader.load_package(segmentation_package_dir / "tissue-seg.pt2", CPU)
    shapes = probe.probe_outputs(seg, BUILTIN_SPECS["tissue-seg"])
    with pytest.raises(SpecMismatch, match="expects a per-tile embedding vector"):
        families.check_consistency(BUILTIN_SPECS["h0-mini"], shapes)


@pytest.mark.parametrize(
    ("name", "shapes", "needle"),
    [
        ("m-optimus", [torch.Size([1536])], "expects 2 output"),
        ("m-optimus", [torch.Size([4, 8]), torch.Size([1536])], "prediction vector"),
        (
            "m-optimus",
            [torch.Size([32]), torch.Size([768])],
            "embedding_dim 1536 but the package returns 768",
        ),
        ("tissue-seg", [torch.Size([1, 256, 256])], "512x512"),
        ("h0", [torch.Size([1536]), torch.Size([3])], "expects 1 output"),
    ],
)
def test_check_consistency_messages(name: str, shapes: list, needle: str) -> None:
    with pytest.raises(SpecMismatch, match=needle):
        families.check_consistency(BUILTIN_SPECS[name], shapes)
