"""Inputs: slide paths, CSV manifests, slide ids and shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from histoserve.errors import UsageError
from histoserve.slides.manifest import (
    MAX_SLIDE_ID_BYTES,
    SlideEntry,
    check_slide_id,
    check_unique,
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


def test_a_manifest_saved_as_latin1_is_a_usage_error_naming_line_and_byte(
    tmp_path: Path,
) -> None:
    """Excel's plain 'CSV' on Windows writes cp1252: say where, and how to re-save."""
    manifest = tmp_path / "m.csv"
    manifest.write_bytes("slide_id,path\nA,a.svs\nCafé,b.svs\n".encode("cp1252"))
    with pytest.raises(UsageError) as info:
        read_manifest(manifest)
    message = str(info.value)
    assert f"manifest {manifest} is not UTF-8 text: line 3: byte 0xe9 (byte 26" in message
    assert "re-save it as UTF-8" in message


SLURM = {
    "SLURM_ARRAY_TASK_ID": "0",
    "SLURM_ARRAY_TASK_COUNT": "400",
    "SLURM_ARRAY_TASK_MIN": "0",
    "SLURM_ARRAY_TASK_MAX": "399",
}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        (None, {}, None),
        ("0/1", {}, (0, 1)),
        ("2/3", {}, (2, 3)),
        (" 1/4 ", {}, (1, 4)),
        ("4", {"JOB_COMPLETION_INDEX": "3"}, (3, 4)),
        ("400", {"SLURM_ARRAY_TASK_ID": "17"}, (17, 400)),  # a Slurm array task
        ("400", {"SLURM_ARRAY_TASK_ID": "203", "SLURM_ARRAY_TASK_COUNT": "2"}, (203, 400)),
        ("4", {"JOB_COMPLETION_INDEX": "1", "SLURM_ARRAY_TASK_ID": "2"}, (1, 4)),
        ("auto", {**SLURM, "SLURM_ARRAY_TASK_ID": "399"}, (399, 400)),
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
        ("4", {}, "SLURM_ARRAY_TASK_ID"),
        ("400", {"SLURM_ARRAY_TASK_ID": "400"}, r"--array=0-<N-1>"),
        ("auto", {"JOB_COMPLETION_INDEX": "3"}, r"SLURM_ARRAY_TASK_ID is not set"),
        (
            "auto",
            {**SLURM, "SLURM_ARRAY_TASK_MIN": "17", "SLURM_ARRAY_TASK_COUNT": "2"},
            "--shard N",
        ),
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


def test_ids_up_to_the_byte_limit_are_taken() -> None:
    assert 255 - len("_patches.h5") == MAX_SLIDE_ID_BYTES  # every file of a slide fits
    for text in (
        "a" * MAX_SLIDE_ID_BYTES,
        "é" * (MAX_SLIDE_ID_BYTES // 2),
        "患者-01",
        "S 1 (re-scan)",
    ):
        assert check_slide_id(text) == text


@pytest.mark.parametrize(
    "slide_id",
    ["x" * (MAX_SLIDE_ID_BYTES + 1), "é" * (MAX_SLIDE_ID_BYTES // 2) + "x", "x" * 256, "é" * 128],
)
def test_a_long_id_is_a_usage_error_naming_the_line_and_the_limit(
    tmp_path: Path, slide_id: str
) -> None:
    manifest = _write(tmp_path / "m.csv", f"slide_id,path\nok,a.svs\n{slide_id},b.svs\n")
    n_bytes = len(slide_id.encode())
    with pytest.raises(
        UsageError, match=rf"line 3: slide id .* is {n_bytes} bytes of UTF-8"
    ) as err:
        read_manifest(manifest)
    assert f"limit of {MAX_SLIDE_ID_BYTES}" in str(err.value) and len(str(err.value)) < 400


@pytest.mark.parametrize(
    ("slide_id", "code"),
    [
        ("S\n1", "000A"),
        ("S\r1", "000D"),
        ("S\t1", "0009"),
        ("\x1b[31mS1", "001B"),
        ("S\x7f1", "007F"),
        ("S\x851", "0085"),
        ("S\u20281", "2028"),
        ("S\u20291", "2029"),
    ],
)
def test_control_characters_in_an_id_are_a_usage_error_naming_the_line(
    tmp_path: Path, slide_id: str, code: str
) -> None:
    quoted = '"' + slide_id.replace('"', '""') + '"'
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(f"slide_id,path\nok,a.svs\n{quoted},b.svs\n".encode())
    with pytest.raises(UsageError, match=rf"m\.csv line \d: .*control character U\+{code}") as err:
        read_manifest(manifest)
    assert slide_id not in str(err.value)  # shown escaped, never raw


def test_an_id_from_a_file_name_that_is_no_utf8_is_a_usage_error() -> None:
    name = b"S\xff1.svs".decode("utf-8", "surrogateescape")  # as Python reads such a name
    with pytest.raises(
        UsageError, match=r"'S\\udcff1\.svs': slide id 'S\\udcff1' is not valid UTF-8"
    ):
        entries_from_paths([name])


@pytest.mark.parametrize(
    ("first", "second"),
    [("S1", "s1"), ("Straße", "STRASSE"), ("caf\u00e9", "cafe\u0301"), ("ﬁle", "file")],
)
def test_ids_differing_only_by_case_or_normalisation_are_a_usage_error_naming_both(
    tmp_path: Path, first: str, second: str
) -> None:
    manifest = _write(
        tmp_path / "m.csv", f"slide_id,path\n{first},a.svs\nB,b.svs\n{second},c.svs\n"
    )
    with pytest.raises(UsageError, match="differ only by case or Unicode normalisation") as err:
        read_manifest(manifest)
    message = str(err.value)
    assert repr(first) in message and repr(second) in message
    assert "m.csv line 2 and " in message and "m.csv line 4" in message


def test_collisions_are_found_across_paths_and_the_manifest() -> None:
    entries = [SlideEntry("s1", Path("d/s1.svs"), source="d/s1.svs"), SlideEntry("S1", Path("x"))]
    with pytest.raises(UsageError, match=r"'s1' and 'S1' differ only by case.*d/s1\.svs and x"):
        check_unique(entries)


@pytest.mark.parametrize(
    ("row", "column", "code"),
    [
        ("A,a\0b.svs", "path", "0000"),
        ("A,a.svs,,counts\0.csv", "bulk_rna", "0000"),
        ('A,a.svs,,,"mask\x1b[2J.geojson"', "mask", "001B"),
    ],
)
def test_control_characters_in_a_path_are_a_usage_error_naming_the_line(
    tmp_path: Path, row: str, column: str, code: str
) -> None:
    """A NUL in a path gave a traceback (``ValueError: embedded null byte``) before."""
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(f"slide_id,path,mpp,bulk_rna,mask\nok,a.svs,,,\n{row}\n".encode())
    pattern = rf"m\.csv line 3: {column} .* has the control character U\+{code}"
    with pytest.raises(UsageError, match=pattern) as err:
        read_manifest(manifest)
    assert "\0" not in str(err.value) and "\x1b" not in str(err.value)  # shown escaped
