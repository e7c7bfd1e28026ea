"""A served model decoding jpeg-transport tiles in the batch (``--jpeg_decode device``).

The model is the real embedding package on the CPU; libjpeg-turbo stands in
for nvJPEG (the place's injected decoder, :func:`device_path_on_cpu`), since no GPU exists here: the
deferral in stage 1, the swap in stage 2 and the per-row failures are the
code a CUDA server runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness import slides
from harness.jpeg_slides import corrupt_scan, two_slide_tiles
from harness.packages import package_in
from predictor.codecs.jpeg_input import JpegRegion, jpeg_regions
from predictor.codecs.samples import ModelRequest
from predictor.config import LimitsConfig
from predictor.device.jpeg import host_decoder
from predictor.errors import InvalidInput
from predictor.families import server_model
from predictor.model.device_jpeg import JpegDecodePlace
from predictor.spec import BUILTIN_SPECS

SLIDE_TILE = 256
LAYOUT = np.array([[0, 0, SLIDE_TILE, SLIDE_TILE], [SLIDE_TILE, 0, SLIDE_TILE, 200]], np.int64)
BOXES = np.array([[0, 0, 224, 224], [150, 10, 224, 224], [300, 20, 224, 224]], np.int64)


def device_path_on_cpu(tile_size: int, interpolation: str = "bicubic") -> JpegDecodePlace:
    """The device path on the CPU, libjpeg-turbo standing in for nvJPEG."""
    return JpegDecodePlace("device", torch.device("cpu"), tile_size, interpolation, host_decoder)


@pytest.fixture(scope="module")
def model(embedding_package_dir):
    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    served = server_model(spec, path.name, device="cpu", model_root=embedding_package_dir)
    served.load()
    return served


def _streams() -> list[bytes]:
    return two_slide_tiles(SLIDE_TILE)


def _corrupt(stream: bytes) -> bytes:
    return corrupt_scan(stream)


def _requests(streams: list[bytes], limits: LimitsConfig | None = None) -> list[ModelRequest]:
    regions = jpeg_regions(
        streams, LAYOUT, BOXES, limits=limits or LimitsConfig(), tile_size=224,
        interpolation="bicubic",
    )  # fmt: skip
    return [ModelRequest(i, jpeg=region) for i, region in enumerate(regions)]


def _embed(model, requests, place):
    model.served.jpeg = place
    try:
        samples = [model.prepare_sample(r) for r in requests]
        return samples, model.forward_batch(samples, requests, "embedding")
    finally:
        model.served.jpeg = None


def test_deferred_tiles_embed_as_the_cpu_decode_does(model) -> None:
    requests = _requests(_streams())
    pixels = requests[0].pixels = np.ascontiguousarray(slides.he_tile()[:224, :224])
    requests[0] = ModelRequest(0, pixels=pixels)  # a raw tile batched with jpeg ones
    _, on_cpu = _embed(model, requests, None)
    samples, on_device = _embed(model, requests, device_path_on_cpu(224))
    assert [type(s.tile) for s in samples[1:]] == [JpegRegion, JpegRegion]  # deferred
    for cpu, device in zip(on_cpu, on_device, strict=True):
        np.testing.assert_allclose(device.outputs["embedding"], cpu.outputs["embedding"], atol=1e-5)


def test_a_corrupt_slide_tile_fails_its_rows_and_no_other(model) -> None:
    good, bad = _streams()
    broken = _corrupt(bad)
    requests = _requests([good, broken])
    _, on_cpu = _embed(model, _requests([good, bad]), None)
    _, answers = _embed(model, requests, device_path_on_cpu(224))
    np.testing.assert_allclose(
        answers[0].outputs["embedding"], on_cpu[0].outputs["embedding"], atol=1e-5
    )
    for row in (1, 2):
        assert isinstance(answers[row], InvalidInput)
        assert (answers[row].input_name, answers[row].tile) == ("jpeg_tiles", 1)


def test_a_truncated_stream_is_refused_in_stage_one(model) -> None:
    good, bad = _streams()
    requests = _requests([good, bad[: len(bad) // 2]])
    model.served.jpeg = device_path_on_cpu(224)
    try:
        assert isinstance(model.prepare_sample(requests[0]).tile, JpegRegion)
        with pytest.raises(InvalidInput) as caught:
            model.prepare_sample(requests[2])
    finally:
        model.served.jpeg = None
    assert (caught.value.input_name, caught.value.tile) == ("jpeg_tiles", 1)
    assert "EOI" in caught.value.reason


def test_a_request_declaring_more_than_the_budget_is_refused_before_either_decode() -> None:
    """Refused with its inputs, the same on either path: the message names ``'jpeg_tiles'``,
    so the client reads that batch again as pixels."""
    one_tile = LimitsConfig(max_request_pixels=SLIDE_TILE * SLIDE_TILE)  # one of the two tiles
    with pytest.raises(InvalidInput) as caught:
        _requests(_streams(), one_tile)
    assert caught.value.tile == 1 and "'jpeg_tiles'" in str(caught.value)
    assert f"limit of {SLIDE_TILE * SLIDE_TILE} (max_request_pixels)" in caught.value.reason


def test_each_answer_says_where_its_own_tiles_were_decoded(model) -> None:
    requests = _requests(_streams())
    model.served.jpeg = device_path_on_cpu(224)
    try:
        deferred = [model.prepare_sample(r) for r in requests]
        assert model.served.answer_parameters(deferred)["jpeg_decode"] == "device"
        pixels = [model.prepare_sample(ModelRequest(0, pixels=np.zeros((224, 224, 3), np.uint8)))]
        assert model.served.answer_parameters(pixels)["jpeg_decode"] == "cpu"
    finally:
        model.served.jpeg = None
    assert (
        model.served.answer_parameters([model.prepare_sample(r) for r in requests])["jpeg_decode"]
        == "cpu"
    )


def test_cpu_setting_and_a_cpu_server_never_defer() -> None:
    import torch

    assert not JpegDecodePlace("cpu", torch.device("cpu"), 224, "bicubic").on_device_enabled
    assert not JpegDecodePlace("device", torch.device("cpu"), 224, "bicubic").on_device_enabled
    assert not device_path_on_cpu(224, "lanczos").on_device_enabled
