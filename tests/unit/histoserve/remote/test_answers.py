"""Answers checked against their request: each wrong kind named, retried elsewhere, never used.

The check itself on arrays as a server's answer decodes; then the dispatcher
with real HTTP transports against :class:`harness.bad_server.BadServer` (a
fake: a real server cannot be made to answer wrong); then a property test:
over random batch sizes, concurrency, read-ahead, URLs, injected 503s and
short answers, every tile's row is the server's answer for that tile.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bad_server import BadServer, Faults, pixel_answer, pixel_mask, tamper
from harness.slides import GeneratedSlide
from histoserve.embedding.batches import run_batches
from histoserve.embedding.tissue_remote import from_tiles, model_tissue_mask, to_tiles
from histoserve.remote.answers import ROWS, AnswerCheck, BadAnswer, Expected, PackagePin
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import Dispatcher, RequestFailed, RetryPolicy
from histoserve.remote.served_model import ServerInfo, info_from_config
from histoserve.remote.transport import Answer, HttpTransport, RecyclePolicy
from histoserve.slides.readers import SlideReader, resolve_mpp
from histoserve.tissue.detect import thumbnail
from predictor.spec import resolve_spec

URL = "http://127.0.0.1:1"
DIM = 8  # floats per tile of the fake's pixel answers in these tests


def _config(spec_name: str, outputs: list[dict]) -> dict:
    return {"spec": resolve_spec(spec_name).to_dict(), "outputs": outputs}


H0_MINI = info_from_config(
    "h0-mini",
    _config("h0-mini", [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}]),
)


def _good(n: int) -> Answer:
    return Answer({"embedding": np.random.default_rng(n).random((n, 1536), dtype=np.float32)})


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("short", "answered 1 row for 4 tiles (output 'embedding')"),
        ("empty", "no 'embedding' output (mode 'embedding' asks for it; it answered none)"),
        (
            "rename",
            "no 'embedding' output (mode 'embedding' asks for it; it answered 'embeddings')",
        ),
        ("dtype", "embedding is FP64, expected FP32"),
        ("shape", "embedding has shape [4, 768], expected [4, 1536]"),
        ("nan", "embedding has 3 non-finite values"),
    ],
)
def test_each_wrong_answer_is_named_with_the_url(kind: str, message: str) -> None:
    check = AnswerCheck.for_mode(H0_MINI, "embedding")
    check.verify(_good(4), 4, URL)
    with pytest.raises(BadAnswer) as info:
        check.verify(Answer(tamper(kind, _good(4))), 4, URL)
    assert str(info.value).startswith(f"{URL}: {message}")


def test_more_rows_extra_outputs_and_infinities_are_refused() -> None:
    check = AnswerCheck.for_mode(H0_MINI, "embedding")
    assert check.problem(_good(5), 4) == "answered 5 rows for 4 tiles (output 'embedding')"
    extra = Answer({**_good(4), "prediction": np.zeros((4, 3), np.float32)})
    assert "unexpected output 'prediction'" in (check.problem(extra, 4) or "")
    inf = _good(4)
    inf["embedding"][2, 7] = np.inf
    assert check.problem(inf, 4) == "embedding has 1 non-finite value (NaN or infinity)"
    assert check.problem(Answer({"embedding": np.float32(1.0)}), 1) == "'embedding' is not an array"


def test_modes_ask_for_their_outputs_with_the_configs_dims() -> None:
    outputs = [
        {"name": "prediction", "datatype": "FP32", "shape": [-1, 32]},
        {"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]},
    ]
    info = info_from_config("m-optimus", _config("m-optimus", outputs))
    both = AnswerCheck.for_mode(info, "prediction_with_embedding")
    answer = Answer({"prediction": np.ones((2, 32), np.float32), **_good(2)})
    assert both.problem(answer, 2) is None
    assert both.problem(Answer({"prediction": answer["prediction"]}), 2).startswith(
        "no 'embedding'"
    )
    only = AnswerCheck.for_mode(info, "prediction")
    assert only.outputs == (Expected("prediction", "FP32", ((ROWS, 32),)),)
    assert "unexpected output 'embedding'" in only.problem(answer, 2)
    wrong_k = Answer({"prediction": np.ones((2, 31), np.float32)})
    assert only.problem(wrong_k, 2) == "prediction has shape [2, 31], expected [2, 32]"


def test_tissue_masks_must_be_uint8_tiles_of_the_models_size() -> None:
    seg = info_from_config("tissue-seg", _config("tissue-seg", []))  # no list: from the spec
    check = AnswerCheck.for_tissue(seg)
    assert check.outputs == (Expected("mask", "UINT8", ((ROWS, 512, 512),)),)
    assert check.problem(Answer({"mask": np.zeros((3, 512, 512), np.uint8)}), 3) is None
    half = Answer({"mask": np.zeros((3, 256, 512), np.uint8)})
    assert check.problem(half, 3) == "mask has shape [3, 256, 512], expected [3, 512, 512]"
    assert check.problem(Answer({"mask": np.zeros((1, 512, 512), np.uint8)}), 3).startswith(
        "answered 1 row for 3 tiles"
    )


@pytest.fixture
def fakes() -> Iterator[list[BadServer]]:
    made: list[BadServer] = []
    yield made
    for server in made:
        server.stop()


def _dispatcher(urls: list[str], max_attempts: int = 8) -> Dispatcher:
    recycle = RecyclePolicy(max_requests=1000, max_age_s=60)
    transports = [HttpTransport(u, 10.0, recycle) for u in urls]
    retry = RetryPolicy(max_attempts=max_attempts, cool_down_s=60.0)
    return Dispatcher(transports, retry, sleep=lambda _s: None, seed=0)


def _client(urls: list[str], info: ServerInfo, max_attempts: int = 8) -> HistoserveClient:
    """The client core over ``urls``, as ``embed`` makes it (the model already described)."""
    retry = RetryPolicy(max_attempts=max_attempts, cool_down_s=60.0)
    recycle = RecyclePolicy(max_requests=1000, max_age_s=60)
    return HistoserveClient(urls, info.model, 10.0, retry=retry, recycle=recycle, info=info)


def _tiles(first_row: int, n: int) -> np.ndarray:
    """``n`` 4x4 tiles of rows ``first_row...``, each a function of its row alone (and unique)."""
    rows = np.arange(first_row, first_row + n, dtype=np.int64)[:, None]
    pixel = np.arange(48, dtype=np.int64)
    values = (rows * 131 + pixel * 17 + (rows * pixel) % 97) % 256
    return values.astype(np.uint8).reshape(n, 4, 4, 3)


PIXEL_CHECK = AnswerCheck((Expected.per_row("embedding", "FP32", (-1, DIM)),), "mode 'embedding'")


def test_a_wrong_answer_is_retried_on_another_url(fakes: list[BadServer]) -> None:
    bad = BadServer(source="pixels", tamper="short", dim=DIM)
    good = BadServer(source="pixels", dim=DIM)
    fakes += [bad, good]
    tiles = _tiles(0, 4)
    with _dispatcher([bad.url, good.url]) as dispatcher:
        out = dispatcher.infer("m", {"pixels": tiles}, check=PIXEL_CHECK)
        assert dispatcher.failed_attempts == 1
    np.testing.assert_array_equal(out["embedding"], pixel_answer(tiles, DIM))
    assert (bad.infer_requests, good.infer_requests) == (1, 1)


def test_when_attempts_run_out_the_url_and_the_fault_are_named(fakes: list[BadServer]) -> None:
    fakes.append(BadServer(source="pixels", tamper="dtype", dim=DIM))
    with (
        _dispatcher([fakes[0].url], max_attempts=3) as dispatcher,
        pytest.raises(RequestFailed) as info,
    ):
        dispatcher.infer("m", {"pixels": _tiles(0, 2)}, check=PIXEL_CHECK)
    assert f"failed 3 times; last error: {fakes[0].url}: embedding is FP64" in str(info.value)
    assert fakes[0].infer_requests == 3


def test_tissue_model_answers_are_checked_too(
    fakes: list[BadServer], tiff_slide: GeneratedSlide
) -> None:
    """A short mask answer is retried elsewhere, never spread over the batch's tiles."""
    seg = ServerInfo("seg", "segmentation", 64, 8.0, ("embedding",),
                     outputs={"mask": ("UINT8", (-1, 64, 64))})  # fmt: skip
    bad, good = BadServer(source="mask", tamper="short"), BadServer(source="mask")
    fakes += [bad, good]
    with SlideReader.open(tiff_slide.path) as reader:
        mpp = resolve_mpp(reader, None, None, 0.05)
        image, _ = thumbnail(reader, mpp, seg.mpp)
        with _client([bad.url], seg, max_attempts=2) as alone, pytest.raises(RequestFailed) as info:
            model_tissue_mask(reader, mpp, alone, seg)
        with _client([bad.url, good.url], seg) as both:
            mask, _ = model_tissue_mask(reader, mpp, both, seg)
    assert f"{bad.url}: answered 1 row for 8 tiles (output 'mask')" in str(info.value)
    tiles, grid = to_tiles(image, 64)
    np.testing.assert_array_equal(mask, from_tiles(pixel_mask(tiles), grid, *image.shape[:2]) > 0)
    assert len(tiles) > 8 and bad.infer_requests == 3  # two alone, one beside the good URL


@pytest.fixture(scope="module")
def pool() -> Iterator[list[BadServer]]:
    servers = [BadServer(source="pixels", dim=DIM) for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n_rows=st.integers(0, 40),
    batch_size=st.integers(1, 9),
    concurrency=st.integers(1, 6),
    read_workers=st.integers(1, 3),
    queue_batches=st.integers(1, 4),
    n_urls=st.integers(1, 3),
    p_503=st.floats(0.0, 0.3),
    p_short=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**16),
)
def test_every_row_is_the_servers_answer_for_its_tile(
    pool: list[BadServer],
    n_rows: int,
    batch_size: int,
    concurrency: int,
    read_workers: int,
    queue_batches: int,
    n_urls: int,
    p_503: float,
    p_short: float,
    seed: int,
) -> None:
    servers = pool[:n_urls]
    for i, server in enumerate(servers):  # fresh faults per example, one stream per server
        server.set_faults(Faults(p_503, p_short, seed + i))
    bad_rows = set(range(3, n_rows, 11))

    def read(index: int) -> tuple[np.ndarray, np.ndarray]:
        start = index * batch_size
        n = min(n_rows, start + batch_size) - start
        ok = np.array([start + i not in bad_rows for i in range(n)], bool)
        return _tiles(start, n), ok

    with _dispatcher([s.url for s in servers], max_attempts=40) as dispatcher:

        def send(tiles: np.ndarray, rows: slice) -> dict[str, np.ndarray]:
            return dispatcher.infer("m", {"pixels": tiles}, check=PIXEL_CHECK)

        out = run_batches(
            n_rows, batch_size, read, send, read_workers=read_workers,
            concurrency=concurrency, queue_batches=queue_batches,
        )  # fmt: skip
    good = np.array([r not in bad_rows for r in range(n_rows)], bool)
    np.testing.assert_array_equal(out.ok, good)
    if good.any():
        expected = pixel_answer(_tiles(0, n_rows)[good], DIM)
        np.testing.assert_array_equal(out.outputs["embedding"][good], expected)


def test_an_answer_naming_another_model_or_package_is_refused() -> None:
    """Replicas of two packages behind one URL (mid-upgrade) must not mix in one slide."""
    from histoserve.remote.transport import Answer

    served = _config("h0-mini", [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}])
    info = info_from_config("h0-mini", {**served, "package_sha256": "a" * 64})
    check = AnswerCheck.for_mode(info, "embedding")
    same = {"model_name": "h0-mini", "parameters": {"package_sha256": "a" * 64}}
    assert check.problem(Answer(_good(2), same), 2) is None
    other = Answer(_good(2), {**same, "parameters": {"package_sha256": "b" * 64}})
    assert check.problem(other, 2).startswith(f"answered with package {'b' * 16}, not {'a' * 16}")
    renamed = Answer(_good(2), {**same, "model_name": "h1"})
    assert check.problem(renamed, 2).startswith("answered as model 'h1', not 'h0-mini'")
    made_up = AnswerCheck.for_mode(H0_MINI, "embedding")  # no digest reported: names only
    assert made_up.problem(other, 2) is None and made_up.problem(renamed, 2) is not None


def test_an_answer_naming_no_package_is_refused_when_the_config_reported_one() -> None:
    """A histoserve server names its package in every answer; silence is refused.

    One check family for the tile client and the slide head: the client's own
    check of a head's answers is the same identity check.
    """
    from histoserve.heads.head import head_check, head_from_config

    served = _config("h0-mini", [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}])
    info = info_from_config("h0-mini", {**served, "package_sha256": "a" * 64})
    silent = Answer(_good(2), {"model_name": "h0-mini", "model_version": None})
    problem = AnswerCheck.for_mode(info, "embedding").problem(silent, 2)
    assert problem.startswith("answered without naming its package"), problem
    assert f"reported package {'a' * 16} at the start of the run" in problem
    assert AnswerCheck.for_mode(H0_MINI, "embedding").problem(silent, 2) is None
    head = info_from_config("abmil-demo", _slide_config("a" * 64))
    slide = Answer({"prediction": np.ones(2, np.float32)}, {"model_name": "abmil-demo"})
    client_check = AnswerCheck.for_request(head, None)  # what the client holds a head's answers to
    assert client_check.problem(slide, 5) == problem.replace("h0-mini", "abmil-demo")
    outputs = head_check(head_from_config("abmil-demo", _slide_config("a" * 64)))
    assert outputs.problem(slide, 5) is None  # the outputs are the head's own check
    wide = Answer({"prediction": np.ones(3, np.float32)}, {})
    assert outputs.problem(wide, 5) == "prediction has shape [3], expected [2]"


def _slide_config(digest: str) -> dict:
    outputs = [{"name": "prediction", "datatype": "FP32", "shape": [2]}]
    inputs = [{"name": "features", "datatype": "FP32", "shape": [-1, 1536]}]
    spec = {**resolve_spec("abmil-demo").to_dict(), "modes": ["prediction"]}
    return {"package_sha256": digest, "spec": spec, "inputs": inputs, "outputs": outputs}


def test_a_jpeg_answer_must_name_the_decode_its_transport_asks() -> None:
    """Device-decoded features never land in a CPU cohort, nor the reverse; pixels are not asked.

    Checked with or without a package digest (a gRPC-only run reports none).
    """
    from histoserve.remote.transport import Answer

    served = _config("h0-mini", [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}])
    info = info_from_config("h0-mini", {**served, "package_sha256": "a" * 64})

    def answer(**decode: str) -> Answer:
        return Answer(_good(2), {"parameters": {"package_sha256": "a" * 64, **decode}})

    cpu, device, silent = answer(jpeg_decode="cpu"), answer(jpeg_decode="device"), answer()
    for base in (
        AnswerCheck.for_mode(info, "embedding"),
        AnswerCheck.for_mode(H0_MINI, "embedding"),
    ):
        pixels, jpeg = base.for_transport("pixels"), base.for_transport("jpeg")
        assert [pixels.problem(a, 2) for a in (cpu, device, silent)] == [None] * 3
        assert jpeg.problem(cpu, 2) is None
        assert jpeg.problem(device, 2).startswith(
            "decoded the request's JPEG tiles on 'device' (parameters.jpeg_decode), not on "
            "'cpu' as --transport jpeg or auto asks: not used"
        )
        assert jpeg.problem(silent, 2).startswith(
            "decoded the request's JPEG tiles without saying where"
        )
        on_device = base.for_transport("jpeg-device")
        assert on_device.problem(device, 2) is None
        assert "on 'cpu' (parameters.jpeg_decode), not on 'device'" in on_device.problem(cpu, 2)
        assert "--transport jpeg-device asks" in on_device.problem(silent, 2)


@pytest.mark.parametrize(
    ("answers", "refused"),
    [
        ((None, "a" * 64), "though the run's first answer named no package"),
        (("a" * 64, None), "without naming its package, though the run's first answer named"),
        (("a" * 64, "b" * 64), "not aaaaaaaaaaaaaaaa that the run's first answer named"),
    ],
)
def test_without_a_reported_digest_the_first_answer_pins_named_or_not(answers, refused):
    """Replicas of two servers, one naming its package and one not (an older server in a
    rolling update), never both feed one run: the first answer pins which kind it is."""
    pin = PackagePin("")
    first, second = answers
    assert pin.problem(first) is None and pin.problem(first) is None
    assert refused in (pin.problem(second) or "")
