"""Inputs: slide paths, CSV manifests, slide ids and shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.client.embed.errors import UsageError
from predictor.client.embed.manifest import (
    SlideEntry,
    entries_from_paths,
    parse_shard,
    read_manifest,
    select_shard,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_paths_take_the_file_stem_as_id() -> None:
    entries = entries_from_paths(["/data/a/S1.svs", Path("rel/S2.ome.tiff")])
    assert [e.slide_id for e in entries] == ["S1", "S2.ome"]
    assert entries[0].path == Path("/data/a/S1.svs")
    assert entries[0].mpp is None and entries[0].bulk_rna is None


def test_paths_with_one_stem_twice_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"duplicate slide id 'S1'.*manifest"):
        entries_from_paths(["a/S1.svs", "b/S1.tiff"])


@pytest.mark.parametrize("bad", ["", ".hidden", "..", "a/b", "a\\b"])
def test_slide_ids_must_be_plain_file_names(bad: str) -> None:
    with pytest.raises(UsageError, match="plain file name"):
        SlideEntry(bad, Path("x.svs"))


def test_manifest_resolves_relative_paths_against_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "cohort"
    folder.mkdir()
    manifest = _write(
        folder / "slides.csv",
        "slide_id,path,mpp,bulk_rna\nA,slides/a.svs,0.25,rna/a.csv\nB,/abs/b.tiff,,\n\n",
    )
    a, b = read_manifest(manifest)
    assert a == SlideEntry("A", folder / "slides/a.svs", 0.25, folder / "rna/a.csv")
    assert b == SlideEntry("B", Path("/abs/b.tiff"), None, None)


def test_manifest_with_only_the_required_columns(tmp_path: Path) -> None:
    manifest = _write(tmp_path / "m.csv", "path,slide_id\nx.svs,X\n")
    assert read_manifest(manifest) == [SlideEntry("X", tmp_path / "x.svs")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,path\nA,a.svs\n", r"missing \['slide_id'\], unknown \['id'\]"),
        ("slide_id,path,magnification\nA,a.svs,40\n", r"unknown \['magnification'\]"),
        ("slide_id,path,mpp\nA,a.svs,fast\n", r"line 2: mpp 'fast' is not a number"),
        ("slide_id,path,mpp\nA,a.svs,-0.5\n", r"line 2: mpp must be a positive number"),
        ("slide_id,path\nA,a.svs\nB,\n", r"line 3: slide_id and path must not be empty"),
        ("slide_id,path\nA,a.svs\nA,b.svs\n", r"duplicate slide id 'A'"),
        ("slide_id,path\n", "lists no slides"),
        ("slide_id,path\n../x,a.svs\n", "plain file name"),
    ],
)
def test_bad_manifests_are_usage_errors_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        read_manifest(_write(tmp_path / "m.csv", text))


def test_missing_manifest_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read manifest"):
        read_manifest(tmp_path / "absent.csv")


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        (None, {}, None),
        ("0/1", {}, (0, 1)),
        ("2/3", {}, (2, 3)),
        (" 1/4 ", {}, (1, 4)),
        ("4", {"JOB_COMPLETION_INDEX": "3"}, (3, 4)),
    ],
)
def test_parse_shard(text: str | None, env: dict[str, str], expected: tuple[int, int]) -> None:
    assert parse_shard(text, env) == expected


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("3/3", {}, r"index must be in 0..2, got 3"),
        ("-1/3", {}, r"index must be in 0..2, got -1"),
        ("0/0", {}, "at least 1"),
        ("a/b", {}, "integers"),
        ("1/2/3", {}, "I/N or N"),
        ("4", {}, "JOB_COMPLETION_INDEX"),
        ("4", {"JOB_COMPLETION_INDEX": "4"}, r"index must be in 0..3, got 4"),
    ],
)
def test_bad_shards_are_usage_errors(text: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_shard(text, env)


def test_shards_are_disjoint_cover_everything_and_ignore_input_order() -> None:
    ids = [f"S{i:02d}" for i in range(11)]
    entries = [SlideEntry(i, Path(f"{i}.svs")) for i in reversed(ids)]
    shards = [select_shard(entries, (i, 3)) for i in range(3)]
    got = [e.slide_id for shard in shards for e in shard]
    assert sorted(got) == ids and len(got) == len(set(got))
    assert [e.slide_id for e in shards[1]] == ["S01", "S04", "S07", "S10"]
    assert [e.slide_id for e in select_shard(entries, None)] == ids
