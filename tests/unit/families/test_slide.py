"""The slide family without a package: its V2 codec, modes, stage 1, options and queue weights."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from kserve import InferInput, InferRequest

from predictor.batching.queue import BatchPolicy, BatchQueue
from predictor.codecs.samples import ModelRequest, ModelResponse
from predictor.codecs.v2_slide import SlideInput
from predictor.config import BatchingConfig, LimitsConfig
from predictor.errors import InvalidInput, SpecError
from predictor.families import build_demo_model, family_for, server_model
from predictor.families.slide import SlideFamily, first_beyond, input_limit, slide_options
from predictor.model.base import BaseServerModel
from predictor.model.options import ServingOptions
from predictor.spec import BUILTIN_SPECS, spec_from_dict

ABMIL = BUILTIN_SPECS["abmil-demo"]
MEAN = BUILTIN_SPECS["mean-pool"]


@pytest.fixture
def model(tmp_path: Path) -> BaseServerModel:
    options = ServingOptions(limits=LimitsConfig(max_tiles_per_slide=100))
    return server_model(ABMIL, "abmil.pt2", "cpu", tmp_path, options=options)


def _request(*inputs: InferInput, params: dict | None = None) -> InferRequest:
    return InferRequest(model_name="abmil-demo", infer_inputs=list(inputs), parameters=params)


def _features(array: np.ndarray, datatype: str = "FP32") -> InferInput:
    inp = InferInput("features", list(array.shape), datatype)
    inp._raw_data = array.tobytes()
    return inp


def _slide(features: np.ndarray) -> ModelRequest:
    """One slide's request item, as the slide codec makes it."""
    return ModelRequest(index=0, family_input=SlideInput(features), tiles=len(features))


def _decode(model: BaseServerModel, *inputs: InferInput) -> ModelRequest:
    decoded = model.family.v2_codec(model.name).decode(_request(*inputs))
    assert len(decoded.items) == 1
    return decoded.items[0]


def test_the_family_is_registered_with_its_specs() -> None:
    assert family_for(ABMIL) is SlideFamily
    assert ABMIL.feature_dim == 1536 and ABMIL.classes == ("class_0", "class_1")
    assert MEAN.modes == ("embedding", "attention") and MEAN.embedding_dim == 1536
    assert SlideFamily.package_outputs(MEAN) == ("attention", "slide_embedding")


def test_a_slide_spec_needs_a_width_and_classes_with_prediction() -> None:
    """The slide family's section, checked through the registry (the spec builds alone)."""
    base = {**ABMIL.to_dict(), "name": "x"}
    for changes, needle in (
        ({"feature_dim": 0}, "feature_dim"),
        ({"classes": []}, "classes"),
        ({"modes": ["prediction_with_embedding"]}, "modes"),
    ):
        with pytest.raises(SpecError, match=needle):
            family_for(spec_from_dict({**base, **changes}))
    assert spec_from_dict(ABMIL.to_dict()) == ABMIL
    assert family_for(ABMIL) is SlideFamily


def test_features_decode_as_one_item_whatever_the_float_type(model: BaseServerModel) -> None:
    x = np.random.default_rng(0).normal(size=(7, 1536)).astype(np.float32)
    assert np.array_equal(_decode(model, _features(x)).family_input.features, x)
    half = _decode(model, _features(x.astype(np.float16), "FP16")).family_input.features
    assert half.dtype == np.float16 and np.array_equal(half, x.astype(np.float16))
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bfloat16
    widened = _decode(model, _features(bf16, "BF16")).family_input.features
    assert np.allclose(widened, x, rtol=1e-2) and widened.dtype == np.float32
    coords = InferInput("coords", [7, 2], "INT64", data=list(range(14)))
    item = _decode(model, _features(x), coords)
    assert item.tiles == 7 and item.family_input.coords.shape == (7, 2)


@pytest.mark.parametrize(
    ("shape", "datatype", "match"),
    [
        ((7, 768), "FP32", "features are 768 wide but model 'abmil-demo' takes 1536"),
        ((0, 1536), "FP32", "empty slide: N is 0 tiles"),
        ((101, 1536), "FP32", "101 tiles, more than the limit of 100 per slide"),
        ((7, 1536, 1), "FP32", r"shape must be \[N, D\]"),
        ((7, 1536), "INT32", "datatype must be one of"),
    ],
)
def test_bad_features_are_400s_naming_the_input(model, shape, datatype, match) -> None:
    inp = InferInput("features", list(shape), datatype)
    inp._raw_data = bytes(int(np.prod(shape)) * 4)
    with pytest.raises(InvalidInput, match=match) as err:
        model.family.v2_codec(model.name).decode(_request(inp))
    assert err.value.input_name == "features"


def test_other_inputs_are_refused(model: BaseServerModel) -> None:
    x = np.zeros((3, 1536), np.float32)
    with pytest.raises(InvalidInput, match=r"N = 3"):
        model.family.v2_codec(model.name).decode(
            _request(_features(x), InferInput("coords", [2, 2], "INT64", [0] * 4))
        )
    with pytest.raises(InvalidInput, match="unknown input"):
        model.family.v2_codec(model.name).decode(
            _request(InferInput("pixels", [1, 2, 2, 3], "UINT8", [0] * 12))
        )


def test_a_non_finite_feature_is_a_400_naming_its_tile(model: BaseServerModel) -> None:
    x = np.ones((5, 1536), np.float32)
    x[3, 10] = np.nan
    with pytest.raises(InvalidInput, match="non-finite") as err:
        model.prepare_sample(_slide(x))
    assert (err.value.input_name, err.value.tile) == ("features", 3)
    with pytest.raises(InvalidInput, match="takes V2 'features'"):
        model.prepare_sample(ModelRequest(index=0, image_data=b"png"))


def test_a_feature_beyond_the_package_dtype_is_a_400_naming_its_tile(
    model: BaseServerModel,
) -> None:
    """Issue 33, case 11: 1e5 cast into an FP16 package became inf, then NaN with a 200."""
    import torch

    assert input_limit(torch.float16) == 65504.0 and input_limit(torch.float32) == float(
        np.finfo(np.float32).max
    )
    x = np.ones((5, 1536), np.float32)
    x[3, 10] = -1e5
    assert first_beyond(x, input_limit(torch.float16)) == (3, -1e5)
    assert first_beyond(x, input_limit(torch.float32)) is None
    model.prepare_sample(_slide(x))  # an FP32 package takes it
    model.family.input_limit = input_limit(
        torch.float16
    )  # what bind_device sets for an FP16 package
    with pytest.raises(InvalidInput, match="beyond the package's finite range") as err:
        model.prepare_sample(_slide(x))
    assert (err.value.input_name, err.value.tile) == ("features", 3)


def test_stage_1_gives_writable_contiguous_float32(model: BaseServerModel) -> None:
    x = np.frombuffer(np.ones((4, 1536), np.float16).tobytes(), np.float16).reshape(4, 1536)
    tile = model.prepare_sample(_slide(x)).tile
    assert tile.dtype == np.float32 and tile.flags.writeable and tile.flags.c_contiguous


def test_modes_combine_in_spec_order(model: BaseServerModel) -> None:
    assert model.family.resolve_mode(None) == "prediction"
    assert model.family.resolve_mode("attention, prediction") == "prediction,attention"
    assert model.output_names("prediction,attention") == ("prediction", "attention")
    assert model.output_names("embedding") == ("slide_embedding",)
    for bad in ("prediction,prediction", "prediction,bogus", "prediction_with_embedding"):
        with pytest.raises(InvalidInput) as err:
            model.family.resolve_mode(bad)
        assert err.value.input_name == "parameters.mode"


def test_answers_keep_each_output_s_own_shape(model: BaseServerModel) -> None:
    decoded = model.family.v2_codec(model.name).decode(
        _request(_features(np.zeros((3, 1536), np.float32)))
    )
    outputs = {"prediction": np.ones(2), "attention": np.full(3, 1 / 3)}
    answer = model.family.v2_codec(model.name).encode(
        decoded, [ModelResponse(outputs)], ("prediction", "attention")
    )
    assert [(o.name, o.shape, o.datatype) for o in answer.outputs] == [
        ("prediction", [2], "FP32"),
        ("attention", [3], "FP32"),
    ]


def test_options_one_slide_a_forward_and_the_largest_slide_fits_the_queue() -> None:
    options = ServingOptions(batching=BatchingConfig(max_batch_size=32, max_queue_size=1024))
    slide = slide_options(options, None)
    assert slide.batching.max_batch_size == 1
    assert slide.batching.max_queue_size == slide.limits.max_tiles_per_slide == 200_000


def test_the_queue_counts_a_slide_s_tiles() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        queue: BatchQueue[int, None] = BatchQueue(10, weight=lambda n: n)
        assert queue.admit([6], "k", loop, 0.0) is not None
        assert queue.admit([5], "k", loop, 0.0) is None  # 6 + 5 tiles > 10
        assert queue.admit([4], "k", loop, 0.0) is not None and queue.depth == 10
        assert [e.item for e in BatchPolicy(1).take(queue, 0.0)[0]] == [6] and queue.depth == 4
        queue.fail_all(RuntimeError("x"))
        assert queue.depth == 0

    asyncio.run(run())


def test_demo_modules_attention_sums_to_one() -> None:
    import torch

    with torch.no_grad():
        prediction, attention, embedding = build_demo_model(ABMIL)(torch.randn(7, 1536))
    assert prediction.shape == (2,) and embedding.shape == (512,)
    assert float(attention.sum()) == pytest.approx(1.0, abs=1e-6)
    mean_attention, mean = build_demo_model(MEAN)(torch.ones(4, 1536))
    assert torch.equal(mean, torch.ones(1536)) and torch.allclose(
        mean_attention, torch.full((4,), 0.25)
    )


def test_the_package_s_range_bounds_a_slide() -> None:
    package = SimpleNamespace(metadata={"histoserve.provenance": '{"max_batch": 5000}'})
    slide = slide_options(ServingOptions(), package)  # type: ignore[arg-type]
    assert slide.limits.max_tiles_per_slide == 5000 and slide.batching.max_queue_size == 5000


def test_export_defaults_n_to_200000_for_slide_heads() -> None:
    from predictor.export.build import build_parser

    args = build_parser().parse_args(["--spec", "abmil-demo", "--demo", "--output", "x.pt2"])
    assert args.max_batch is None
    assert family_for(ABMIL).DEFAULT_MAX_BATCH == 200_000
    assert family_for(BUILTIN_SPECS["h0-mini"]).DEFAULT_MAX_BATCH == 256


def test_unguarded_sums_patch_only_inside_the_with() -> None:
    from torch._inductor.codegen.cpp import CppKernel

    from predictor.export.reductions import unguarded_cpu_sums

    original = CppKernel.need_use_acc_helper
    with unguarded_cpu_sums():
        assert CppKernel.need_use_acc_helper is not original
    assert CppKernel.need_use_acc_helper is original


def test_several_front_ends_are_refused(model: BaseServerModel) -> None:
    from predictor.errors import StartupError
    from predictor.multiprocess.supervisor import check_crossable

    with pytest.raises(StartupError, match="--frontends 1"):
        check_crossable(model)
