"""harness/slides.py: a process writes each distinct slide once, and no caller can spoil another's."""

from __future__ import annotations

from pathlib import Path

from harness import slides

SPEC = slides.SlideSpec(width=1024, height=768, boxes=((256, 256, 512, 256),), downsamples=(1, 4))


def test_the_same_spec_is_written_once_and_copied(tmp_path: Path, monkeypatch) -> None:
    written: list[Path] = []
    write_new = slides._write_new
    monkeypatch.setattr(slides, "_write_new", lambda p, s: written.append(p) or write_new(p, s))
    first = slides.write_slide(tmp_path / "a.svs", SPEC)
    original = first.path.read_bytes()
    first.path.write_bytes(original[: len(original) // 2])  # a test that spoils its own copy
    second = slides.write_slide(tmp_path / "b" / "b.svs", SPEC)
    assert second.path.read_bytes() == original
    assert second.path.stat().st_ino != first.path.stat().st_ino
    assert second.level_dimensions == ((1024, 768), (256, 192))
    assert written == [first.path]
    other = slides.write_slide(tmp_path / "c.svs", slides.SlideSpec(**{**vars(SPEC), "tile": 128}))
    assert other.path.read_bytes() != original and written[1:] == [other.path]
