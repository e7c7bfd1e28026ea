"""The exporter: demo models, the CLI end to end, metadata, dynamic batch, ``--module``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.factories import WRONG_DIM_TARGET, wrong_dim_encoder
from harness.packages import demo_package, module_package
from predictor.errors import CheckpointError, IncompatiblePackage, SpecError, SpecMismatch
from predictor.export import build as export
from predictor.families import build_demo_model, demo_example_inputs
from predictor.families.embedding import PRESETS
from predictor.families.multimodal.genes import demo_gene_ids, read_gene_ids, write_gene_ids
from predictor.families.segmentation import DemoSegmenter
from predictor.packages import digest as pkg_digest
from predictor.packages import host as pkg_host
from predictor.packages import metadata as pkg_meta
from predictor.packages import weights_layout
from predictor.packages.host import HostFacts
from predictor.runtime import loader, probe
from predictor.runtime.load_probe import describe_build
from predictor.spec import BUILTIN_SPECS, METADATA_KEY

CPU = torch.device("cpu")
AVX2_ONLY = frozenset(
    {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "sse4_1", "sse4_2", "ssse3"}
)


def only_pt2(directory: Path) -> Path:
    (path,) = sorted(directory.glob("*.pt2"))
    return path


# -- demo models (eager, no compile) -------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("h0-mini", [(3, 1536)]),
        ("h1", [(3, 1536)]),
        ("m-optimus", [(3, 32), (3, 1536)]),
        ("tissue-seg", [(3, 1, 512, 512)]),
    ],
)
def test_demo_model_geometry(name: str, shapes: list[tuple[int, ...]]) -> None:
    spec = BUILTIN_SPECS[name]
    with torch.no_grad():
        out = build_demo_model(spec)(*demo_example_inputs(spec, 3))
    outs = out if isinstance(out, tuple) else (out,)
    assert [tuple(o.shape) for o in outs] == shapes
    assert all(bool(torch.isfinite(o).all()) for o in outs)


@pytest.mark.parametrize("name", ["h0-mini", "m-optimus"])
def test_demo_embeddings_tell_tiles_apart(name: str) -> None:
    spec = BUILTIN_SPECS[name]
    with torch.no_grad():
        out = build_demo_model(spec)(*demo_example_inputs(spec, 4))
    emb = out[-1] if isinstance(out, tuple) else out
    for i in range(4):
        for j in range(i + 1, 4):
            assert (emb[i] - emb[j]).abs().max() > 0.05
            assert torch.cosine_similarity(emb[i], emb[j], dim=0) < 0.99


def test_multimodal_missing_bulk_rna_uses_learned_default() -> None:
    spec = BUILTIN_SPECS["m-optimus"]
    model = build_demo_model(spec)
    tiles, bulk = demo_example_inputs(spec, 2)
    nan_rows = torch.full_like(bulk, float("nan"))
    default_rows = model.default_rna.detach().expand_as(bulk)
    with torch.no_grad():
        pred_nan, emb_nan = model(tiles, nan_rows)
        pred_default, _ = model(tiles, default_rows)
        pred_real, emb_real = model(tiles, torch.zeros_like(bulk))
    assert torch.allclose(pred_nan, pred_default)
    assert bool((pred_nan >= 0).all())  # log space, non-negative
    assert not torch.allclose(pred_nan, pred_real)  # bulk RNA matters
    assert torch.equal(emb_nan, emb_real)  # the embedding is the tile's


def test_demo_model_is_deterministic_per_seed() -> None:
    spec = BUILTIN_SPECS["h0"]
    a, b, c = (build_demo_model(spec, seed=s) for s in (0, 0, 1))
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.head.weight, c.head.weight)


def test_demo_presets_geometry() -> None:
    assert (PRESETS["vit-s"].width, PRESETS["vit-s"].depth, PRESETS["vit-s"].heads) == (384, 12, 6)
    assert (PRESETS["vit-g"].width, PRESETS["vit-g"].depth, PRESETS["vit-g"].heads) == (
        1536,
        40,
        24,
    )
    model = build_demo_model(BUILTIN_SPECS["m-optimus"], depth=1, width=32, heads=2)
    assert model.vit.prefix.shape == (1, 5, 32)  # m-optimus: 5 prefix tokens


def test_padded_segmenter_pads_the_batch_axis() -> None:
    model = DemoSegmenter(pad_to_batch=4).eval()
    with torch.no_grad():
        out = model(torch.randn(3, 3, 64, 64))
    assert out.shape == (4, 1, 64, 64)
    assert bool((out[3] == 0).all())


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: build_demo_model(BUILTIN_SPECS["h0"], "vit-xl"), "vit-xl"),
        (lambda: build_demo_model(BUILTIN_SPECS["h0"], colour=1), "colour"),
        (lambda: build_demo_model(BUILTIN_SPECS["h0"], width=100, heads=3), "divisible"),
        (lambda: build_demo_model(BUILTIN_SPECS["tissue-seg"], pad_to_batch=0), "pad_to_batch"),
    ],
)
def test_demo_model_errors(call, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        call()


# -- packages built through the CLI (cached) -----------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "spec_name", "extra_files"),
    [
        ("embedding_package_dir", "h0-mini", set()),
        ("multimodal_package_dir", "m-optimus", {"genes_in.csv", "genes_out.csv"}),
        ("segmentation_package_dir", "tissue-seg", set()),
    ],
)
def test_cli_demo_package_layout_and_metadata(
    request, fixture: str, spec_name: str, extra_files: set
) -> None:
    directory = request.getfixturevalue(fixture)
    names = {p.name for p in directory.iterdir()}
    assert names == {f"{spec_name}.pt2", f"{spec_name}.pt2.sha256"} | extra_files
    path = directory / f"{spec_name}.pt2"
    assert pkg_digest.verify_sha256(path) is True
    digest_line = (directory / f"{spec_name}.pt2.sha256").read_text().split()
    assert digest_line == [pkg_digest.sha256_file(path), path.name]
    metadata = pkg_meta.read_metadata(path)
    assert pkg_meta.embedded_spec(metadata) == BUILTIN_SPECS[spec_name]
    assert json.loads(metadata[METADATA_KEY])["name"] == spec_name
    for key in (
        "AOTI_DEVICE_KEY",
        "AOTI_CPU_ISA",
        "AOTI_COMPUTE_CAPABILITY",
        "AOTI_PLATFORM",
        "AOTI_MACHINE",
    ):
        assert key in metadata
    assert metadata["AOTI_DEVICE_KEY"] == "cpu"
    prov = pkg_meta.provenance(metadata)
    assert prov["source"] == "demo:tiny" and prov["torch_version"] == torch.__version__
    assert (prov["dtype"], prov["device"], prov["min_batch"], prov["max_batch"]) == (
        "fp32",
        "cpu",
        1,
        256,
    )
    assert prov["weights_sha256"] is None
    created = dt.datetime.fromisoformat(prov["created_utc"])
    assert created.utcoffset() == dt.timedelta(0)
    size = BUILTIN_SPECS[spec_name].tile_size
    inputs = json.loads(metadata[pkg_meta.INPUTS_KEY])
    assert inputs[0] == {"name": "tiles", "shape": [-1, 3, size, size], "dtype": "float32"}
    assert json.loads(metadata[pkg_meta.CPU_BUILD_KEY])["march"] == "native"


def test_multimodal_gene_lists_match_the_package(multimodal_package_dir: Path) -> None:
    metadata = pkg_meta.read_metadata(multimodal_package_dir / "m-optimus.pt2")
    inputs = json.loads(metadata[pkg_meta.INPUTS_KEY])
    outputs = json.loads(metadata[pkg_meta.OUTPUTS_KEY])
    assert [d["name"] for d in inputs] == ["tiles", "bulk_rna"]
    assert [d["name"] for d in outputs] == ["prediction", "embedding"]
    genes_in = read_gene_ids(multimodal_package_dir / "genes_in.csv")
    genes_out = read_gene_ids(multimodal_package_dir / "genes_out.csv")
    assert (
        (len(genes_in), len(genes_out))
        == (inputs[1]["shape"][1], outputs[0]["shape"][1])
        == (64, 32)
    )
    assert all(g.startswith("ENSG") for g in genes_in + genes_out)


@pytest.mark.parametrize(
    "fixture", ["embedding_package_dir", "multimodal_package_dir", "segmentation_package_dir"]
)
def test_dynamic_batch_1_and_5_match_eager(request, fixture: str) -> None:
    path = only_pt2(request.getfixturevalue(fixture))
    loaded = loader.load_package(path, CPU)
    spec = loaded.embedded_spec
    eager = build_demo_model(spec)
    for batch in (1, 5):
        inputs = demo_example_inputs(spec, batch, seed=batch)
        with torch.no_grad():
            expected = eager(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = loaded(*inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_batch_above_the_exported_range_is_refused(embedding_package_dir: Path) -> None:
    loaded = loader.load_package(only_pt2(embedding_package_dir), CPU)
    prov = pkg_meta.provenance(loaded.metadata)
    assert (prov["min_batch"], prov["max_batch"]) == (1, 256)
    with pytest.raises(RuntimeError, match="too large"):
        loaded(torch.zeros(257, 3, 224, 224))


def test_bf16_export_records_and_takes_bf16(tmp_path: Path) -> None:
    path = demo_package("h0-mini", dtype="bf16")  # the runner tests' export
    loaded = loader.load_package(path, CPU)
    assert loaded.input_dtype == torch.bfloat16
    assert pkg_meta.provenance(loaded.metadata)["dtype"] == "bf16"
    (out,) = loaded(torch.zeros(3, 3, 224, 224, dtype=torch.bfloat16))
    assert out.shape == (3, 1536)
    assert probe.probe_outputs(loaded, BUILTIN_SPECS["h0-mini"]) == (torch.Size([1536]),)


def test_cli_module_source() -> None:
    path = module_package("h0-mini", WRONG_DIM_TARGET)
    metadata = pkg_meta.read_metadata(path)
    assert pkg_meta.provenance(metadata)["source"] == f"module:{WRONG_DIM_TARGET}"
    assert json.loads(metadata[pkg_meta.OUTPUTS_KEY])[0]["shape"] == [-1, 768]
    loaded = loader.load_package(path, CPU)
    inputs = demo_example_inputs(BUILTIN_SPECS["h0-mini"], 1)
    with torch.no_grad():
        expected = wrong_dim_encoder(BUILTIN_SPECS["h0-mini"])(*inputs)
    torch.testing.assert_close(loaded(*inputs)[0], expected, rtol=1e-4, atol=1e-4)


# -- CLI and API errors (no compile) --------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--spec", "h9", "--demo"], "unknown spec 'h9'"),
        (["--spec", "h0", "--module", "nocolon"], "pkg.mod:factory"),
        (["--spec", "h0", "--module", "no_such_mod_xyz:f"], "cannot import"),
        (["--spec", "h0", "--module", "predictor.export.build:nothing_here"], "no attribute"),
        (["--spec", "h0", "--module", "predictor.export.build:DTYPES"], "not callable"),
        (["--spec", "h0", "--timm", "vit_giant_patch14_dinov2"], "--weights"),
        (["--spec", "h0", "--demo", "--min_batch", "8", "--max_batch", "4"], "min_batch"),
        (
            ["--spec", "tissue-seg", "--timm", "vit_small", "--weights", "w.pt"],
            "embedding specs only",
        ),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, capsys, argv: list[str], needle: str) -> None:
    assert export.main([*argv, "--output", str(tmp_path / "x.pt2")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.startswith("histoserve export: error:") and "\n" not in err
    assert not list(tmp_path.iterdir())


def test_cli_timm_without_timm_is_clear(tmp_path: Path, capsys) -> None:
    weights = tmp_path / "w.pt"
    torch.save({}, weights)
    argv = [
        "--spec",
        "h0-mini",
        "--timm",
        "vit_base_patch14_reg4_dinov2",
        "--weights",
        str(weights),
    ]
    assert export.main([*argv, "--output", str(tmp_path / "x.pt2")]) == 2
    assert "pip install 'histoserve[export]'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--spec", "h0"], ["--spec", "h0", "--demo", "--module", "a:b"]])
def test_cli_needs_exactly_one_source(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        export.main([*argv, "--output", str(tmp_path / "x.pt2")])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"dtype": "fp64"}, "fp64"),
        ({"device": "mps"}, "mps"),
        ({"cpu_target": "arm"}, "arm"),
        ({"min_batch": 0}, "min_batch"),
        ({"weights_layout": "separate"}, "weights layout 'separate'"),
    ],
)
def test_export_package_validates_before_compiling(
    tmp_path: Path, kwargs: dict, needle: str
) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    with pytest.raises(SpecError, match=needle):
        export.export_package(
            build_demo_model(spec, depth=1),
            spec,
            tmp_path / "x.pt2",
            example_inputs=demo_example_inputs(spec, 2),
            **kwargs,
        )


def test_build_from_factory_with_and_without_spec() -> None:
    spec = BUILTIN_SPECS["h0"]
    assert isinstance(
        export.export_sources.build_from_factory(lambda: nn.Identity(), spec), nn.Identity
    )
    got = export.export_sources.build_from_factory(
        lambda spec: nn.Linear(spec.embedding_dim, 1), spec
    )
    assert got.in_features == 1536
    with pytest.raises(SpecError, match=r"not an nn\.Module"):
        export.export_sources.build_from_factory(lambda: 3, spec)


def test_gene_lists_are_checked_before_compiling(tmp_path: Path) -> None:
    spec = BUILTIN_SPECS["m-optimus"]
    model = build_demo_model(spec, depth=1, genes_in=8, genes_out=4)
    inputs = demo_example_inputs(spec, 2, genes_in=8)
    lists = (demo_gene_ids(8), demo_gene_ids(5))
    with pytest.raises(SpecMismatch, match="output gene list has 5 genes but the model uses 4"):
        export.export_package(
            model, spec, tmp_path / "m.pt2", example_inputs=inputs, gene_lists=lists
        )
    assert not list(tmp_path.iterdir())


def test_cli_gene_list_flags_go_together(tmp_path: Path, capsys) -> None:
    genes_in = write_gene_ids(tmp_path / "in.csv", demo_gene_ids(3))
    argv = [
        "--spec",
        "m-optimus",
        "--demo",
        "--genes_in",
        str(genes_in),
        "--output",
        str(tmp_path / "m.pt2"),
    ]
    assert export.main(argv) == 2
    assert "--genes_in and --genes_out go together" in capsys.readouterr().err


def test_mapped_weights_serve_what_embedded_weights_serve(embedding_package_dir: Path) -> None:
    """``--weights_layout mmap``: recorded, built (bytes after the library's ELF image), and the
    same outputs through both runners as the default package of the same demo weights."""
    embedded = only_pt2(embedding_package_dir)
    mapped = demo_package("h0-mini", weights_layout="mmap")
    assert pkg_meta.provenance(pkg_meta.read_metadata(embedded))["weights_layout"] == "embedded"
    mapped_meta = pkg_meta.read_metadata(mapped)
    assert pkg_meta.provenance(mapped_meta)["weights_layout"] == "mmap"
    assert weights_layout.library_layout(mapped) == "mmap"
    assert "weights mapped" in describe_build(mapped_meta)
    (tiles,) = demo_example_inputs(BUILTIN_SPECS["h0-mini"], 3)
    want = loader.load_package(embedded, CPU, runner="torch")(tiles)[0]
    for runner in ("torch", "gil_free"):
        got = loader.load_package(mapped, CPU, runner=runner)(tiles)[0]
        assert torch.equal(got, want), runner


def test_a_layout_the_library_does_not_have_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights_layout, "inductor_configs", lambda layout: {})  # mmap not asked
    spec = BUILTIN_SPECS["h0-mini"]
    with pytest.raises(CheckpointError, match="would record weights layout 'mmap' but its "
                       "library was built 'embedded'"):  # fmt: skip
        export.export_package(
            build_demo_model(spec, depth=1), spec, tmp_path / "x.pt2",
            example_inputs=demo_example_inputs(spec, 2), max_batch=4, weights_layout="mmap",
        )  # fmt: skip
    assert not list(tmp_path.glob("*.pt2"))


@pytest.mark.slow  # a second full export for the x86-64-v3 target (about 70 s): `make test-long`
def test_portable_cpu_target(embedding_package_dir: Path) -> None:
    path = demo_package("h0-mini", cpu_target="x86-64-v3", max_batch=8)
    metadata = pkg_meta.read_metadata(path)
    assert metadata["AOTI_CPU_ISA"] == "AVX2"
    assert json.loads(metadata[pkg_meta.CPU_BUILD_KEY])["march"] == "x86-64-v3"
    avx2_host = dataclasses.replace(HostFacts.detect(), cpu_flags=AVX2_ONLY)
    pkg_host.check_host_compat(metadata, CPU, avx2_host)
    native = pkg_meta.read_metadata(only_pt2(embedding_package_dir))
    if json.loads(native[pkg_meta.CPU_BUILD_KEY])["required_flags"] != sorted(AVX2_ONLY):
        with pytest.raises(IncompatiblePackage, match="--cpu_target x86-64-v3"):
            pkg_host.check_host_compat(native, CPU, avx2_host)
    loaded = loader.load_package(path, CPU)
    (tiles,) = demo_example_inputs(BUILTIN_SPECS["h0-mini"], 2)
    with torch.no_grad():
        expected = build_demo_model(BUILTIN_SPECS["h0-mini"])(tiles)
    torch.testing.assert_close(loaded(tiles)[0], expected, rtol=1e-4, atol=1e-4)
