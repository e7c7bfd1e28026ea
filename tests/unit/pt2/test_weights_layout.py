"""Where a package keeps its weights: the rule, and the layout read back from a library."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from harness.packages import package_in
from predictor.errors import CheckpointError
from predictor.pt2 import weights_layout as layouts

LIBRARY = "pkg/data/aotinductor/model/c1.wrapper.so"


@pytest.mark.parametrize(
    ("requested", "constants_bytes", "layout"),
    [
        ("auto", 170_000_000, "embedded"),  # a bf16 ViT-B
        ("auto", layouts.EMBED_LIMIT_BYTES, "embedded"),
        ("auto", 2_270_000_000, "mmap"),  # a bf16 ViT-g: torch cannot link it into the library
        ("mmap", 1_000, "mmap"),
    ],
)
def test_the_layout_rule(requested: str, constants_bytes: int, layout: str) -> None:
    assert layouts.resolve(requested, constants_bytes) == layout
    configs = layouts.inductor_configs(layout)
    assert configs == ({"aot_inductor.force_mmap_weights": True} if layout == "mmap" else {})


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="'separate'"):
        layouts.resolve("separate", 0)


def _package(tmp_path: Path, library: bytes) -> Path:
    path = tmp_path / "p.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(LIBRARY, library)
    return path


def _elf(section_table_end: int) -> bytes:
    """A 64-bit ELF header whose section header table ends at ``section_table_end``."""
    shentsize, shnum = 64, 4
    header = struct.pack("<4sB35xQ10xHH", b"\x7fELF", 2, section_table_end - shentsize * shnum,
                         shentsize, shnum)  # fmt: skip
    return header + b"\0" * 2


def test_bytes_after_the_elf_image_are_mapped_weights(tmp_path: Path) -> None:
    image = _elf(4096).ljust(4096, b"\0")
    assert layouts.library_layout(_package(tmp_path, image)) == "embedded"
    assert layouts.library_layout(_package(tmp_path, image + b"w" * 8192)) == "mmap"


@pytest.mark.parametrize(
    ("library", "needle"),
    [(b"\x7fEL", "shorter than an ELF header"), (b"MZ" + b"\0" * 100, "not a 64-bit ELF")],
)
def test_a_library_that_is_not_elf_is_named(tmp_path: Path, library: bytes, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle) as caught:
        layouts.library_layout(_package(tmp_path, library))
    assert "p.pt2" in str(caught.value)


def test_a_package_without_a_library_is_named(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/archive_format", "pt2")
    with pytest.raises(CheckpointError, match="model library cannot be read"):
        layouts.library_layout(path)


def test_a_demo_package_embeds_its_weights(embedding_package_dir: Path) -> None:
    assert layouts.library_layout(package_in(embedding_package_dir)) == "embedded"
