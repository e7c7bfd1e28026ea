"""decode_v1/encode_v1: the V1 instances/predictions format."""

from __future__ import annotations

import base64
import contextlib
import json

import numpy as np
import orjson
import pytest
from fastapi.responses import ORJSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from predictor.codecs.samples import ModelResponse
from predictor.codecs.v1 import INSTANCE_FIELDS, METADATA_FIELDS, decode_v1, encode_v1
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.spec import BUILTIN_SPECS

ENCODER = BUILTIN_SPECS["h0-mini"]
MULTI = BUILTIN_SPECS["m-optimus"]
IMAGE = base64.b64encode(b"\x89PNG fake but base64-valid").decode()


def test_instances_become_items_with_metadata(encode, rgb, limits):
    png = encode(rgb, "PNG")
    meta = {
        "slide_name": "s1.svs",
        "x": 10,
        "y": 20,
        "width": 224,
        "height": 224,
        "tissue_ratio": 0.8,
        "patch_idx": 3,
        "resolution": 0.5,
    }
    body = {
        "instances": [
            {"image_data": base64.b64encode(png).decode(), "bulk_rna": [1, 2.5, 0], **meta},
            {"image_data": IMAGE},
        ],
        "parameters": {"mode": "prediction", "unknown": True},
        "signature_name": "ignored",
    }
    decoded = decode_v1(body, spec=MULTI, limits=limits)
    assert (decoded.tile_input, decoded.mode) == ("image_data", "prediction")
    first, second = decoded.items
    assert first.index == 0 and first.image_data == png
    assert first.family_input.dtype == np.float32 and first.family_input.tolist() == [1.0, 2.5, 0.0]
    assert second.index == 1 and second.family_input is None
    assert decoded.echo == [meta, {}]  # echo fields stay with the codec, not the items
    assert set(INSTANCE_FIELDS) == {"image_data", "bulk_rna", *METADATA_FIELDS}


def test_mode_is_optional(limits):
    decoded = decode_v1(
        {"instances": [{"image_data": IMAGE, "bulk_rna": None}]}, spec=ENCODER, limits=limits
    )
    assert decoded.mode is None and decoded.items[0].family_input is None


REFUSALS = [
    # (body, spec, match, input_name)
    ([], ENCODER, "must be a JSON object with 'instances', got list", None),
    ({}, ENCODER, "needs an 'instances' list$", None),
    ({"inputs": []}, ENCODER, r"V2 'inputs' go to /v2/models/\{name\}/infer", None),
    ({"instances": {"image_data": IMAGE}}, ENCODER, "'instances' must be a list, got dict", None),
    ({"instances": []}, ENCODER, "'instances' is empty", None),
    (
        {"instances": [{"image_data": IMAGE}], "parameters": []},
        ENCODER,
        "'parameters' must be an object",
        None,
    ),
    (
        {"instances": [{"image_data": IMAGE}], "parameters": {"mode": 1}},
        ENCODER,
        "parameter 'mode' must be a string",
        None,
    ),
    (
        {"instances": ["abc"]},
        ENCODER,
        "must be an object with 'image_data', got str",
        "instances[0]",
    ),
    (
        {"instances": [{"image_data": IMAGE}, {"image": IMAGE}]},
        ENCODER,
        "unknown field",
        "instances[1].image",
    ),
    ({"instances": [{"slide_name": "s"}]}, ENCODER, "missing", "instances[0].image_data"),
    ({"instances": [{"image_data": "%%%"}]}, ENCODER, "invalid base64", "instances[0].image_data"),
    (
        {"instances": [{"image_data": IMAGE + "\n"}]},
        ENCODER,
        "invalid base64",
        "instances[0].image_data",
    ),
    ({"instances": [{"image_data": ""}]}, ENCODER, "empty image data", "instances[0].image_data"),
    (
        {"instances": [{"image_data": ["x"]}]},
        ENCODER,
        "expected a base64 string, got list",
        "instances[0].image_data",
    ),
    (
        {"instances": [{"image_data": {"b64": IMAGE}}]},
        ENCODER,
        "got dict",
        "instances[0].image_data",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [1]}]},
        ENCODER,
        "takes no bulk RNA",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": "1,2"}]},
        MULTI,
        "non-empty list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": []}]},
        MULTI,
        "non-empty list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [1, "2"]}]},
        MULTI,
        "flat list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [[1], [2]]}]},
        MULTI,
        "flat list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [[1], 2]}]},
        MULTI,
        "flat list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [True, False]}]},
        MULTI,
        "flat list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [1, None]}]},
        MULTI,
        "flat list of numbers",
        "instances[0].bulk_rna",
    ),
    (
        {"instances": [{"image_data": IMAGE, "bulk_rna": [1.0, 1e39]}]},
        MULTI,
        r"1e\+39 at 1 is not a finite FP32",
        "instances[0].bulk_rna",
    ),
]


@pytest.mark.parametrize(("body", "spec", "match", "input_name"), REFUSALS)
def test_refusals_name_the_field(body, spec, match, input_name):
    with pytest.raises(InvalidInput, match=match) as info:
        decode_v1(body, spec=spec, limits=LimitsConfig())
    assert info.value.input_name == input_name
    if input_name:
        assert str(info.value).startswith(f"input '{input_name}': ")


def test_limits():
    limits = LimitsConfig(max_tiles_per_request=1, max_image_bytes=10, max_bulk_rna_length=2)
    with pytest.raises(InvalidInput, match="2 instances, more than the limit of 1"):
        decode_v1({"instances": [{"image_data": IMAGE}] * 2}, spec=MULTI, limits=limits)
    with pytest.raises(InvalidInput, match="more than the 16 that 10 bytes take"):
        decode_v1({"instances": [{"image_data": IMAGE}]}, spec=MULTI, limits=limits)
    small = base64.b64encode(b"abc").decode()
    with pytest.raises(InvalidInput, match="3 values, more than the limit of 2"):
        decode_v1(
            {"instances": [{"image_data": small, "bulk_rna": [1, 2, 3]}]}, spec=MULTI, limits=limits
        )


# --- encode -----------------------------------------------------------------


def test_predictions_carry_output_embedding_and_metadata():
    batch = np.arange(12, dtype=np.float32).reshape(2, 6)
    responses = [
        ModelResponse(outputs={"prediction": batch[i, :4], "embedding": batch[i, 4:]})
        for i in range(2)
    ]
    echo = [{"x": 0}, {"x": 1}]
    out = encode_v1(responses, output_names=["prediction", "embedding"], echo=echo)
    assert [p["x"] for p in out["predictions"]] == [0, 1]
    assert out["predictions"][1]["output"].tolist() == [6, 7, 8, 9]
    assert out["predictions"][1]["embedding"].tolist() == [10, 11]
    only = encode_v1(responses, output_names=["prediction"], echo=echo)
    assert "embedding" not in only["predictions"][0]
    embedding_mode = encode_v1(responses, output_names=["embedding"], echo=echo)
    assert set(embedding_mode["predictions"][0]) == {"output", "x"}


def test_masks_are_flattened():
    mask = np.arange(6, dtype=np.uint8).reshape(2, 3)
    out = encode_v1([ModelResponse(outputs={"mask": mask})], output_names=["mask"])
    assert out["predictions"][0]["output"].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.filterwarnings("ignore::fastapi.exceptions.FastAPIDeprecationWarning")
def test_numpy_goes_straight_through_kserve_orjson_response():
    """KServe answers V1 with ORJSONResponse (OPT_SERIALIZE_NUMPY): no tolist needed."""
    batch = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    mask = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)[:, ::2, ::2]  # non-contiguous view
    big_endian = np.arange(3, dtype=">f4")
    responses = [
        ModelResponse(outputs={"prediction": batch[0], "embedding": batch[1]}),
        ModelResponse(outputs={"prediction": big_endian, "embedding": batch[2]}),
        ModelResponse(outputs={"prediction": mask, "embedding": batch[2, ::2]}),
    ]
    echo = [{"slide_name": "a"}, {}, {}]
    out = encode_v1(responses, output_names=["prediction", "embedding"], echo=echo)
    rendered = ORJSONResponse(content=out).body
    assert rendered == orjson.dumps(
        out, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    )
    parsed = json.loads(rendered)["predictions"]
    for sent, got in zip(out["predictions"], parsed, strict=True):
        assert set(sent) == set(got)
        for key, value in sent.items():
            if isinstance(value, np.ndarray):  # float32 goes out in its shortest exact form
                np.testing.assert_array_equal(np.asarray(got[key], dtype=value.dtype), value)
            else:
                assert got[key] == value
    assert json.loads(rendered)["predictions"][2]["output"] == mask.reshape(-1).tolist()


def test_missing_output_is_a_server_error():
    with pytest.raises(RuntimeError, match="tile 0: the model returned no output 'prediction'"):
        encode_v1([ModelResponse(outputs={})], output_names=["prediction"])


# --- property: nothing but InvalidInput escapes ------------------------------

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=16,
)
_instance = st.dictionaries(
    st.sampled_from([*INSTANCE_FIELDS, "extra"]),
    _json | st.just(IMAGE) | st.lists(st.floats() | st.integers(), max_size=5),
    max_size=5,
)


@settings(max_examples=500, deadline=None)
@given(
    body=_json
    | st.fixed_dictionaries(
        {"instances": st.lists(_instance, max_size=4) | _json},
        optional={"parameters": st.fixed_dictionaries({}, optional={"mode": _json}) | _json},
    ),
    multimodal=st.booleans(),
)
def test_random_bodies_only_raise_invalid_input(body, multimodal):
    with contextlib.suppress(InvalidInput):
        decode_v1(
            body, spec=MULTI if multimodal else ENCODER, limits=LimitsConfig(max_bulk_rna_length=4)
        )
