"""``histoserve embed`` resumes only what was made from the very slide, whole, under a sane id.

Real parts only: generated slides, the demo package served by ``python -m
predictor`` on loopback, the CLI in its own interpreter.

- a manifest remapped (same id, another slide file) and a slide file replaced
  in place re-embed, with the new slide's features; a cohort moved to another
  folder does not;
- a ``clam`` or ``trident`` pair torn as a killed commit leaves it (another
  run's sibling beside the done file) is embedded again, never skipped;
- a 256-byte id, an id with a newline and ids differing only by case are
  usage errors naming the manifest line; an id of the limit embeds;
- a slide whose claim cannot be taken fails alone: the others finish;
- a slide that changes while it is embedded (a copy still running) fails and
  gets no done file; the next run embeds it;
- a NUL in a manifest's path is a usage error naming the line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from harness import slides
from harness.bad_server import BadServer
from harness.embed import read_output, run_embed, status_rows
from harness.server import Server
from histoserve.slides.manifest import MAX_SLIDE_ID_BYTES

pytestmark = pytest.mark.integration
# 1792x1344 at 0.25 um/px, 448 px footprints, --tissue none: 12 tiles per slide.
RUN = ("--tissue", "none", "--batch-size", "8", "--no-qc")
SMALL = {"width": 1792, "height": 1344}


@pytest.fixture(scope="module")
def two_slides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different slides (other tissue boxes, so other pixels and other features)."""
    root = tmp_path_factory.mktemp("identity-slides")
    a = slides.aperio_svs(root / "a.svs", boxes=((448, 448, 896, 448),), **SMALL)
    b = slides.aperio_svs(root / "b.svs", boxes=((0, 0, 896, 896),), **SMALL)
    return a.path, b.path


def _manifest(path: Path, rows: list[tuple[str, Path | str]]) -> Path:
    lines = ["slide_id,path", *(f"{slide_id},{slide}" for slide_id, slide in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _embed(url: str, manifest: Path, out: Path, *args: str) -> dict[str, dict[str, str]]:
    """Runs the manifest; returns this run's status rows by slide id (exit 0 asserted)."""
    before = len(status_rows(out))
    result = run_embed("--manifest", manifest, "--url", url, "--out", out, *RUN, *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return {row["slide_id"]: row for row in status_rows(out)[before:]}


def _same_features(got: Path, want: Path) -> None:
    a, b = read_output(got), read_output(want)
    np.testing.assert_array_equal(a["coords"], b["coords"])
    np.testing.assert_allclose(a["features"], b["features"], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def reference(
    embedding_server: Server, two_slides: tuple[Path, Path], tmp_path_factory
) -> dict[str, Path]:
    """Each slide embedded alone, in a folder of its own: what its features must be."""
    out = {}
    for slide in two_slides:
        folder = tmp_path_factory.mktemp(f"ref-{slide.stem}")
        rows = _embed(embedding_server.base, _manifest(folder / "m.csv", [("P", slide)]), folder)
        assert rows["P"]["status"] == "done"
        out[slide.stem] = folder / "P.h5"
    a, b = (read_output(p)["features"] for p in out.values())
    assert a.shape != b.shape or not np.allclose(a, b)  # the two slides differ
    return out


def test_a_remapped_manifest_re_embeds_with_the_new_slides_features(
    embedding_server: Server, two_slides: tuple[Path, Path], reference: dict, tmp_path: Path
) -> None:
    a, b = two_slides
    url, out = embedding_server.base, tmp_path / "out"
    first = _embed(url, _manifest(tmp_path / "m1.csv", [("PATIENT_042", a)]), out)
    assert first["PATIENT_042"]["status"] == "done"
    corrected = _manifest(tmp_path / "m2.csv", [("PATIENT_042", b)])
    row = _embed(url, corrected, out)["PATIENT_042"]
    assert row["status"] == "done", row  # not "skipped, already done"
    assert row["error"].startswith("re-embedded: slide changed since the done file (path ")
    assert f"{a.resolve()} -> {b.resolve()}" in row["error"] and "bytes" in row["error"]
    _same_features(out / "PATIENT_042.h5", reference["b"])
    again = _embed(url, corrected, out)["PATIENT_042"]
    assert again["status"] == "skipped"


def test_a_slide_replaced_in_place_re_embeds_and_a_moved_cohort_does_not(
    embedding_server: Server, two_slides: tuple[Path, Path], reference: dict, tmp_path: Path
) -> None:
    a, b = two_slides
    url, out = embedding_server.base, tmp_path / "out"
    slide = tmp_path / "cohort" / "S1.svs"
    slide.parent.mkdir()
    shutil.copyfile(a, slide)
    manifest = _manifest(tmp_path / "m.csv", [("S1", slide)])
    assert _embed(url, manifest, out)["S1"]["status"] == "done"
    shutil.copyfile(b, slide)  # the same path, another slide (a re-scan, a re-export)
    row = _embed(url, manifest, out)["S1"]
    assert row["status"] == "done" and "re-embedded: slide changed" in row["error"]
    _same_features(out / "S1.h5", reference["b"])
    moved = tmp_path / "new-mount" / "S1.svs"  # the cohort moved: another path and mtime
    moved.parent.mkdir()
    shutil.copyfile(slide, moved)
    row = _embed(url, _manifest(tmp_path / "moved.csv", [("S1", moved)]), out)["S1"]
    assert row["status"] == "skipped", row


def test_an_id_whose_file_holds_another_slide_id_fails_and_leaves_it(
    embedding_server: Server, two_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    """Issue 33, case 8: on a case-insensitive volume ``s1.h5`` opens ``S1.h5``.

    This file system is case-sensitive, so the volume is FAKED by renaming S1's
    done file to the name ``s1`` opens (what macOS or SMB would show).
    """
    a, b = two_slides
    url, out = embedding_server.base, tmp_path / "out"
    assert _embed(url, _manifest(tmp_path / "m1.csv", [("S1", a)]), out)["S1"]["status"] == "done"
    (out / "S1.h5").rename(out / "s1.h5")
    kept = (out / "s1.h5").read_bytes()
    result = run_embed(
        "--manifest", _manifest(tmp_path / "m2.csv", [("s1", b)]), "--url", url, "--out", out, *RUN
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    row = status_rows(out)[-1]
    assert row["slide_id"] == "s1" and row["status"] == "failed"
    assert "holds slide 'S1', not 's1'" in row["error"]
    assert (out / "s1.h5").read_bytes() == kept  # S1's features, never overwritten
    forced = run_embed(
        "--manifest", tmp_path / "m2.csv", "--url", url, "--out", out, *RUN, "--force"
    )
    assert forced.returncode == 1 and "holds slide 'S1'" in status_rows(out)[-1]["error"]
    assert (out / "s1.h5").read_bytes() == kept


@pytest.mark.parametrize("layout", ["clam", "trident"])
def test_a_torn_pair_is_embedded_again_never_skipped(
    embedding_server: Server, two_slides: tuple[Path, Path], tmp_path: Path, layout: str
) -> None:
    """Run A, then run B with other settings elsewhere, then B's sibling over A's only.

    That is the state a run of B over A's folder killed between its two renames
    leaves: B's coordinates (or ``.pt``) beside A's done file.
    """
    url, slide = embedding_server.base, two_slides[0]
    manifest = _manifest(tmp_path / "m.csv", [("S1", slide)])
    a_out, b_out = tmp_path / "a", tmp_path / "b"
    _embed(url, manifest, a_out, "--layout", layout)
    _embed(url, manifest, b_out, "--layout", layout, "--tissue", "otsu")  # B: fewer tiles
    [a_sibling] = a_out.rglob("S1_patches.h5" if layout == "trident" else "S1.pt")
    b_sibling = b_out / a_sibling.relative_to(a_out)
    original = a_sibling.read_bytes()
    assert b_sibling.read_bytes() != original
    shutil.copyfile(b_sibling, a_sibling)
    row = _embed(url, manifest, a_out, "--layout", layout)["S1"]
    assert row["status"] == "done", row
    rel = a_sibling.relative_to(a_out).as_posix()
    assert f"re-embedded: {rel} is not the file its done file recorded" in row["error"]
    if layout == "trident":
        assert a_sibling.read_bytes() != b_sibling.read_bytes()
        assert len(read_output(a_sibling)["coords"]) == 12
    else:
        import torch

        assert tuple(torch.load(a_sibling).shape) == (12, 1536)


class _GrowingSlide(BadServer):
    """A FAKE in front of the real server: the slide grows at the first request, then answers
    come from the real server. A fake because "the slide changed between its identity and its
    commit" cannot be timed otherwise; everything else is real (the CLI, the server, the slide).
    """

    def __init__(self, upstream: str, slide: Path) -> None:
        super().__init__(upstream)
        self.slide, self.grown = slide, False

    def infer(self, path: str, body: bytes, headers) -> tuple[int, dict[str, str], bytes]:
        if not self.grown:
            self.grown = True
            with open(self.slide, "ab") as handle:  # a copy still running
                handle.write(b"\0" * 4096)
        return super().infer(path, body, headers)


def test_a_slide_changed_while_embedded_gets_no_done_file_and_the_next_run_embeds_it(
    embedding_server: Server, two_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    slide = tmp_path / "cohort" / "S1.svs"
    slide.parent.mkdir()
    shutil.copyfile(two_slides[0], slide)
    manifest = _manifest(tmp_path / "m.csv", [("S1", slide)])
    out = tmp_path / "out"
    with _GrowingSlide(embedding_server.base, slide) as fake:
        result = run_embed("--manifest", manifest, "--url", fake.url, "--out", out, *RUN)
    assert not (out / "S1.h5").exists() and not list(out.rglob("*.h5"))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    [row] = status_rows(out)
    assert row["status"] == "failed" and "changed while it was embedded" in row["error"]
    assert "no done file was written" in row["error"]
    again = _embed(embedding_server.base, manifest, out)["S1"]
    assert again["status"] == "done" and again["error"] == ""


def test_a_nul_in_a_manifest_path_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    stderr = _usage_error(tmp_path, "slide_id,path\nS0,a.svs\nS1,a\0b.svs\n")
    assert "m.csv line 3: path 'a\\x00b.svs' has the control character U+0000" in stderr


def _usage_error(tmp_path: Path, text: str) -> str:
    manifest = tmp_path / "m.csv"
    manifest.write_text(text, encoding="utf-8")
    url = "http://127.0.0.1:9"  # never asked: the manifest is refused first
    result = run_embed("--manifest", manifest, "--url", url, "--out", tmp_path / "out", *RUN)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # before any work
    return result.stderr


def test_a_256_byte_id_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    stderr = _usage_error(tmp_path, f"slide_id,path\nS0,a.svs\n{'x' * 256},b.svs\n")
    assert "m.csv line 3" in stderr and "256 bytes of UTF-8" in stderr
    assert f"limit of {MAX_SLIDE_ID_BYTES}" in stderr


def test_an_id_with_a_newline_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    stderr = _usage_error(tmp_path, 'slide_id,path\nS0,a.svs\n"S\n1",b.svs\n')
    assert "m.csv line 4" in stderr and "control character U+000A" in stderr
    assert "'S\\n1'" in stderr  # escaped, never a raw line break


def test_ids_differing_only_by_case_are_a_usage_error_naming_both(tmp_path: Path) -> None:
    stderr = _usage_error(tmp_path, "slide_id,path\nS1,a.svs\nS2,b.svs\ns1,c.svs\n")
    assert "'S1' and 's1' differ only by case" in stderr
    assert "m.csv line 2 and" in stderr and "m.csv line 4" in stderr


def test_a_slide_whose_claim_fails_fails_alone_and_an_id_of_the_limit_embeds(
    embedding_server: Server, two_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    longest = "é" * (MAX_SLIDE_ID_BYTES // 2)
    rows = [("s0", two_slides[0]), ("s1", two_slides[1]), (longest, two_slides[0])]
    manifest = _manifest(tmp_path / "m.csv", rows)
    out = tmp_path / "out"
    (out / ".claims" / "s0.lock").mkdir(parents=True)  # not a lock file: s0's claim fails
    args = ("--manifest", manifest, "--url", embedding_server.base, "--out", out, *RUN)
    result = run_embed(*args, "--slides-in-flight", "1", "--layout", "trident")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    got = {row["slide_id"]: row for row in status_rows(out)}
    assert got["s0"]["status"] == "failed" and "s0.lock" in got["s0"]["error"]
    assert got["s1"]["status"] == "done" and got[longest]["status"] == "done"
    assert list(out.rglob(f"{longest}_patches.h5"))
