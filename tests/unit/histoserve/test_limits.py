"""Limits: one plausible mpp range for flags, manifest and metadata; JSON nesting measured unparsed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from histoserve import limits
from histoserve.commands.embed import build_parser, config_from_args
from histoserve.embedding.config import EmbedConfig
from histoserve.errors import UsageError
from histoserve.slides import readers
from histoserve.slides.manifest import read_manifest
from histoserve.tissue import mask_geojson
from histoserve.tissue.mask_geojson import json_shape

BASE = {"urls": ("http://127.0.0.1:8080",), "out_dir": Path("out"), "slides": (Path("a.svs"),)}


def test_one_plausible_mpp_range_for_every_source() -> None:
    assert readers.PLAUSIBLE_MPP is limits.PLAUSIBLE_MPP
    low, high = limits.PLAUSIBLE_MPP
    for good in (low, 0.25, 0.5, 8.0, high):
        assert limits.mpp_problem(good) is None
    for bad in (1e-4, low / 2, high * 1.01, 352.8, float("nan"), float("inf")):
        assert "outside 0.01..20 um/px" in (limits.mpp_problem(bad) or "")


@pytest.mark.parametrize(
    ("flag", "field", "value"),
    [("--mpp-override", "mpp_override", 1e-4), ("--target-mpp", "target_mpp", 50.0)],
)
def test_an_implausible_mpp_flag_is_a_usage_error(flag: str, field: str, value: float) -> None:
    with pytest.raises(UsageError, match=rf"{flag} {value!r}: .* outside 0.01..20 um/px"):
        EmbedConfig(**BASE, **{field: value})


def test_a_manifest_mpp_slip_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    manifest = tmp_path / "slides.csv"
    manifest.write_text("slide_id,path,mpp\nA,a.svs,0.25\nB,b.svs,0.00025\n")
    with pytest.raises(
        UsageError, match=r"line 3.*mpp '0.00025': .* outside 0.01..20 um/px"
    ) as err:
        read_manifest(manifest)
    assert str(err.value).count("line 3") == 1, err.value  # named once, not once per layer


def test_max_tiles_per_slide_flag(tmp_path: Path) -> None:
    args = build_parser().parse_args(["a.svs", "--url", "http://h:1", "--out", str(tmp_path)])
    assert config_from_args(args, {}).max_tiles_per_slide == limits.DEFAULT_MAX_TILES_PER_SLIDE
    argv = ["a.svs", "--url", "http://h:1", "--out", str(tmp_path), "--max-tiles-per-slide"]
    assert (
        config_from_args(build_parser().parse_args([*argv, "500"]), {}).max_tiles_per_slide == 500
    )
    with pytest.raises(UsageError, match="--max-tiles-per-slide must be >= 1, got 0"):
        config_from_args(build_parser().parse_args([*argv, "0"]), {})


def depth(raw: bytes) -> int:
    return json_shape(raw)[0]


def test_json_depth_counts_nesting_not_brackets_in_strings() -> None:
    collection = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "properties": {"name": '[[[{{ a " quoted [ name', "color": [1, 2, 3]},
                "geometry": {"type": "MultiPolygon", "coordinates": [[[[0, 0], [1, 0], [0, 1]]]]},
            }
        ],
    }
    raw = json.dumps(collection).encode()
    assert b'\\"' in raw  # an escaped quote inside a string
    assert depth(raw) == 8  # collection, features, feature, geometry, 4 lists of coordinates
    assert depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert depth(b'"[[["') == 0 and depth(b"") == 0
    assert depth(b"[]" * (3 << 22)) == 1  # across the scan's blocks


def test_json_depth_across_block_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b'{"a": [[1, [2]], {"b": [[[3]]]}], "c": "]]]]"}'
    assert depth(raw) == 6
    monkeypatch.setattr(mask_geojson, "_DEPTH_BLOCK", 3)
    assert json_shape(raw) == (6, 12)  # 8 containers, 3 commas, 1


def _polygon(vertices: int) -> bytes:
    ring = [[float(i % 997) + 0.5, float(i // 997) + 0.25] for i in range(vertices - 1)]
    ring.append(ring[0])
    feature = {"type": "Feature", "properties": {"name": "a, [b], {c}"}}
    feature["geometry"] = {"type": "Polygon", "coordinates": [ring]}
    return json.dumps({"type": "FeatureCollection", "features": [feature]}).encode()


def test_json_values_are_counted_unparsed_and_a_mask_at_the_vertex_cap_fits() -> None:
    assert json_shape(b'[1, 2, [3, "4,5"], {"a": 6, "b": [7]}]')[1] == 10
    _, values = json_shape(_polygon(limits.MAX_MASK_VERTICES))
    assert 3 * limits.MAX_MASK_VERTICES <= values <= limits.MAX_MASK_JSON_VALUES


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b"0.5," * (limits.MAX_MASK_JSON_VALUES) + b"0]",  # one flat list of numbers
        b"[" + b"[1,2]," * (limits.MAX_MASK_JSON_VALUES // 3) + b"[1,2]]",  # small vertices
    ],
    ids=["flat-numbers", "tiny-vertices"],
)
def test_a_mask_with_more_values_than_the_vertex_cap_needs_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    path = tmp_path / "bomb.geojson"
    path.write_bytes(b'{"type": "FeatureCollection", "features": ' + body + b"}")
    assert path.stat().st_size <= limits.MAX_MASK_BYTES  # the byte cap alone lets it through

    def parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed before its size in values was judged")

    monkeypatch.setattr(mask_geojson.json, "loads", parse)
    with pytest.raises(mask_geojson.SlideError, match=r"bomb.geojson: about [\d,]+ JSON values"):
        mask_geojson.read_geojson(path)


@pytest.mark.parametrize(
    ("field", "flag", "value"),
    [
        ("timeout_s", "--timeout-s", float("inf")),
        ("timeout_s", "--timeout-s", float("nan")),
        ("timeout_s", "--timeout-s", 1e12),
        ("recycle_s", "--recycle-s", float("inf")),
        ("batch_size", "--batch-size", 10**9),
        ("max_attempts", "--max-attempts", 10**6),
        ("concurrency", "--concurrency", 10**6),
        ("read_workers", "--read-workers", 10**5),
        ("slides_in_flight", "--slides-in-flight", 10**4),
        ("tile_size", "--tile-size", 10**6),
        ("overlap", "--overlap", 10**6),
        ("max_tiles_per_slide", "--max-tiles-per-slide", 10**30),
    ],
)
def test_every_number_option_has_an_upper_bound(field: str, flag: str, value: float) -> None:
    with pytest.raises(UsageError, match=rf"{flag} must be at most [\d,.]+, got"):
        EmbedConfig(**BASE, **{field: value})


def test_timeout_inf_on_the_command_line_is_a_usage_error(tmp_path: Path) -> None:
    argv = ["a.svs", "--url", "http://h:1", "--out", str(tmp_path), "--timeout-s", "inf"]
    with pytest.raises(UsageError, match="--timeout-s must be at most 86,400"):
        config_from_args(build_parser().parse_args(argv), {})


def test_a_token_of_another_type_in_env_is_a_usage_error(tmp_path: Path) -> None:
    from histoserve.api import embed_config, embed_defaults

    options = {**embed_defaults(), "slides": "a.svs", "url": "http://h:1", "out": tmp_path}
    with pytest.raises(UsageError, match=r"\$HISTOSERVE_TOKEN: expected a string, got int"):
        embed_config(options, {"HISTOSERVE_TOKEN": 123})  # type: ignore[dict-item]
