"""The notebook API: ``histoserve.embed``'s options are the CLI's, and ``read_features`` reads any layout."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

import histoserve
from histoserve import api
from histoserve.commands.embed import build_parser, config_from_args, options_of
from histoserve.embedding.config import EMBED_OPTIONS, EmbedConfig
from histoserve.errors import SlideError, UsageError
from histoserve.options.declare import GROUPS, IS_KIND, SPECIAL_KINDS, declared, option
from tests.unit.histoserve.heads import features as ff

REQUIRED = ["--url", "http://localhost:8080", "--out"]


def test_the_package_names_the_api_and_imports_it_on_first_use():
    assert histoserve.embed is api.embed
    assert histoserve.read_features is api.read_features
    assert histoserve.HistoserveClient.__module__ == "histoserve.remote.client"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        histoserve.nope  # noqa: B018


def test_every_flag_is_a_keyword_argument_and_every_keyword_a_flag(tmp_path):
    args = build_parser().parse_args([*REQUIRED, str(tmp_path)])
    parameters = set(inspect.signature(api.embed).parameters) - {"env"}
    assert set(options_of(args)) == parameters


def test_the_cli_defaults_are_the_api_defaults(tmp_path):
    options = options_of(build_parser().parse_args([*REQUIRED, str(tmp_path)]))
    defaults = api.embed_defaults()
    assert "env" not in defaults and "url" not in defaults and "out" not in defaults
    for name, default in defaults.items():
        given = options[name]
        assert (tuple(given) if isinstance(given, list) else given) == default, name


def test_the_same_options_make_the_same_config(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    argv = [
        "a.svs", "b.tiff", *REQUIRED, str(tmp_path), "--url", "grpc://other:8081",
        "--target-mpp", "0.5", "--batch-size", "32", "--shard", "1/4", "--layout", "trident",
        "--token-file", str(token), "--header", "X-Lab: 1", "--no-qc", "--overlap", "16",
    ]  # fmt: skip
    from_cli = config_from_args(build_parser().parse_args(argv), {})
    from_api = api.embed_config(
        {
            **api.embed_defaults(),
            "slides": ["a.svs", Path("b.tiff")],
            "url": ["http://localhost:8080", "grpc://other:8081"],
            "out": str(tmp_path),
            "target_mpp": 0.5,
            "batch_size": 32,
            "shard": (1, 4),
            "layout": "trident",
            "token_file": token,
            "header": "X-Lab: 1",
            "qc": False,
            "overlap": 16,
        },
        {},
    )
    assert from_api == from_cli
    assert from_api.credentials == from_cli.credentials


def test_a_lone_string_is_one_value_never_its_characters(tmp_path):
    config = api.embed_config(
        {**api.embed_defaults(), "slides": "slide.svs", "url": "http://h:8080", "out": tmp_path},
        {},
    )
    assert config.slides == (Path("slide.svs"),)
    assert config.urls == ("http://h:8080",)
    (tmp_path / "a.svs").touch()
    (tmp_path / "b.svs").touch()
    globbed = {**api.embed_defaults(), "slides": tmp_path.glob("*.svs"), "url": ("http://h:8080",)}
    config = api.embed_config({**globbed, "out": tmp_path / "out"}, {})
    assert sorted(config.slides) == [tmp_path / "a.svs", tmp_path / "b.svs"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("url", 8080, "url: expected a string or a list of strings"),
        ("url", ["http://h:8080", None], "url: expected a string"),
        ("url", "ftp://h", "ftp://h"),
        ("batch_size", 0, "batch"),
        ("slides", 7, "slides: expected a path or paths, got int"),
        ("slides", [b"a.svs"], "slides: expected a path or paths, item 0 is bytes"),
        ("shard", "5/4", "shard"),
        ("shard", (5, 4), "shard"),
        ("shard", (True, 2), "an \\(I, N\\) pair of whole numbers"),
        ("shard", (0.5, 2), "an \\(I, N\\) pair of whole numbers"),
        ("shard", (0, 1, 2), "an \\(I, N\\) pair of whole numbers"),
        ("shard", 3, "an \\(I, N\\) pair of whole numbers"),
        ("out", None, "out: expected a path, got NoneType"),
        ("manifest", b"m.csv", "manifest: expected a path, got bytes"),
        ("batch_size", "64", "batch_size: expected a whole number, got str"),
        ("tile_size", 224.5, "tile_size: expected a whole number, got float"),
        ("overlap", True, "overlap: expected a whole number, got bool"),
        ("timeout_s", "300", "timeout_s: expected a number, got str"),
        ("qc", 0, "qc: expected a flag, got int"),
        ("model", 7, "model: expected a text, got int"),
        ("mode", "predict", "--mode 'predict': must be one of embedding, prediction, "),
        ("reader", "pil", "--reader 'pil': must be one of auto, openslide, native"),
        ("layout", "lazyslide", "--layout 'lazyslide': must be one of flat, trident, clam"),
        ("progress", "fancy", "--progress 'fancy': must be one of auto, bar, plain, none"),
    ],
)
def test_a_bad_option_is_a_usage_error_before_any_slide(tmp_path, option, value, message):
    options = {"slides": tmp_path / "a.svs", "url": "http://h:8080", "out": tmp_path, option: value}
    with pytest.raises(UsageError, match=message):
        histoserve.embed(**options)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("header", [b"Authorization: Bearer S3CRET"]),
        ("header", ["X-Ok: 1", 7, "Authorization: Bearer S3CRET"]),
        ("url", b"http://user:S3CRET@h:8080"),
        ("url", ["http://user:S3CRET@h:8080", 5]),
        ("url", "http://user:S3CRET@h:8080"),
    ],
)
def test_a_refused_credential_is_never_repeated(tmp_path, option, value):
    options = {"url": "http://h:8080", option: value}
    with pytest.raises(UsageError) as refused:
        histoserve.embed(tmp_path / "a.svs", out=tmp_path, **options)
    assert "S3CRET" not in str(refused.value)


def test_each_option_is_one_declaration_that_makes_flag_keyword_kind_default_and_help():
    """The parser, the API's signature and the config's defaults all come from EMBED_OPTIONS."""
    parser = build_parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    parameters = inspect.signature(api.embed).parameters
    config_fields = {f.name: f for f in dataclasses.fields(EmbedConfig)}
    assert set(actions) == {o.keyword for o in EMBED_OPTIONS} == set(parameters) - {"env"}
    helped = parser.format_help()
    for o in EMBED_OPTIONS:
        action, parameter = actions[o.keyword], parameters[o.keyword]
        assert o.kind in IS_KIND or o.kind in SPECIAL_KINDS, o.keyword
        assert action.option_strings == ([] if o.kind == "paths" else [o.flag]), o.keyword
        assert action.required == o.required == (parameter.default is inspect.Parameter.empty)
        if not o.required:
            parsed = action.default
            assert (tuple(parsed) if isinstance(parsed, list) else parsed) == o.default
            assert parameter.default == o.default, o.keyword
        if o.field in config_fields:
            assert config_fields[o.field].default in (o.default, dataclasses.MISSING), o.keyword
        assert (o.flag in helped and o.help.split(";")[0][:30] in " ".join(helped.split())) or (
            o.hidden and o.flag not in helped
        ), o.keyword


def test_an_unknown_or_missing_keyword_is_a_clear_type_error(tmp_path):
    with pytest.raises(
        TypeError, match=r"^embed\(\) got an unexpected keyword argument 'batchsize'$"
    ):
        histoserve.embed(tmp_path / "a.svs", url="http://h:8080", out=tmp_path, batchsize=8)
    with pytest.raises(TypeError, match=r"^embed\(\) missing a required argument: 'out'$"):
        histoserve.embed(tmp_path / "a.svs", url="http://h:8080")
    assert not list(tmp_path.iterdir())


def test_a_declared_field_is_an_option_with_its_flag_keyword_and_default():
    @dataclasses.dataclass(frozen=True)
    class Example:
        dest_dir: str = option(help="where", kind="path", group=GROUPS[0], keyword="dest")
        max_things: int = option(3, help="how many", kind="whole number", group=GROUPS[-1])
        plain: int = 0

    dest, things = declared(Example)
    assert (dest.keyword, dest.flag, dest.field, dest.required) == (
        "dest",
        "--dest",
        "dest_dir",
        True,
    )
    assert (things.flag, things.default, things.required) == ("--max-things", 3, False)


def test_numpy_values_are_taken_as_python_ones(tmp_path):
    urls = np.array(["http://a:8080", "http://b:8080"])
    config = api.embed_config(
        {
            **api.embed_defaults(),
            "slides": "a.svs",
            "url": urls,
            "out": tmp_path,
            "batch_size": np.int64(32),
        },
        {},
    )
    assert config.urls == ("http://a:8080", "http://b:8080") and config.batch_size == 32


def test_the_public_names_are_no_submodule_names():
    """A submodule named like a public function would replace it once imported."""
    from histoserve import _WHERE

    submodules = {p.stem for p in Path(histoserve.__file__).parent.iterdir()}
    assert not set(_WHERE) & submodules
    assert "importlib" not in dir(histoserve) and "embed" in dir(histoserve)


def test_an_unreachable_server_is_a_client_error_not_a_traceback(tmp_path):
    with pytest.raises(histoserve.RemoteError, match="cannot reach"):
        histoserve.embed(
            tmp_path / "missing.svs", url="http://127.0.0.1:9", out=tmp_path / "out",
            max_attempts=1, timeout_s=2, progress="none",
        )  # fmt: skip


@pytest.mark.parametrize("layout", ["flat", "trident", "clam"])
def test_read_features_reads_every_layout_back(tmp_path, layout):
    coords = ff.tissue_coords(40)
    written = ff.features_for(coords, seed=3)
    done = ff.write(layout, tmp_path, "S1", written, coords)
    slide = histoserve.read_features(done)
    np.testing.assert_array_equal(slide.features, written)
    np.testing.assert_array_equal(slide.coords, coords)
    assert slide.attrs["slide_id"] == "S1" and slide.attrs["model"] == "h0-mini"
    assert slide.patch_level0 == ff.PATCH


def test_read_features_takes_a_clam_pt_file_from_its_h5_sibling(tmp_path):
    coords = ff.tissue_coords(12)
    written = ff.features_for(coords, seed=4)
    ff.write("clam", tmp_path, "S2", written, coords)
    pt = tmp_path / "pt_files" / "S2.pt"
    assert pt.is_file()
    slide = histoserve.read_features(pt)
    np.testing.assert_array_equal(slide.features, written)
    np.testing.assert_array_equal(slide.coords, coords)


@pytest.mark.parametrize("name", ["elsewhere/S3.pt", "missing.h5", "not_h5.h5"])
def test_read_features_names_the_file_and_the_reason(tmp_path, name):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name != "missing.h5":
        path.write_bytes(b"not a features file")
    with pytest.raises(SlideError, match=str(path.parent)):
        histoserve.read_features(path)


def test_read_features_refuses_a_symlink(tmp_path):
    coords = ff.tissue_coords(8)
    done = ff.write("flat", tmp_path / "real", "S4", ff.features_for(coords), coords)
    link = tmp_path / "S4.h5"
    link.symlink_to(done)
    with pytest.raises(SlideError, match=r"S4\.h5"):
        histoserve.read_features(link)
