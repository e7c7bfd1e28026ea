"""Where a package keeps its weights: the rule, and the layout read back from a library."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from harness.packages import package_in
from predictor.errors import CheckpointError
from predictor.packages import weights_layout as layouts

LIBRARY = "pkg/data/aotinductor/model/c1.wrapper.so"


@pytest.mark.parametrize(
    ("requested", "constants_bytes", "layout"),
    [
        ("auto", 170_000_000, "embedded"),  # a bf16 ViT-B
        ("auto", 1_900_000_000, "embedded"),
        ("auto", 1_950_000_000, "mmap"),  # near torch's 2e9: never left to its own count
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


def _elf(section_table_end: int, *, elf_class: int = 2, data: int = 1, shnum: int = 4) -> bytes:
    """A 64-bit ELF header (the System V ABI's offsets, written one by one) whose section
    header table of ``shnum`` 64-byte entries ends at ``section_table_end``."""
    header = bytearray(64)
    header[0:4], header[4], header[5] = b"\x7fELF", elf_class, data
    shoff = section_table_end - 64 * shnum if shnum else 0
    struct.pack_into("<Q", header, 0x28, shoff)  # e_shoff
    struct.pack_into("<H", header, 0x3A, 64)  # e_shentsize
    struct.pack_into("<H", header, 0x3C, shnum)  # e_shnum
    return bytes(header)


def test_bytes_after_the_elf_image_are_mapped_weights(tmp_path: Path) -> None:
    image = _elf(4096).ljust(4096, b"\0")
    assert layouts.library_layout(_package(tmp_path, image)) == "embedded"
    assert layouts.library_layout(_package(tmp_path, image + b"w" * 8192)) == "mmap"


@pytest.mark.parametrize(
    ("library", "needle"),
    [
        (b"\x7fEL", "shorter than an ELF header"),
        (b"MZ" + b"\0" * 100, "not a 64-bit little-endian ELF"),
        (_elf(4096, elf_class=1).ljust(4096, b"\0"), "not a 64-bit little-endian ELF"),
        (_elf(4096, data=2).ljust(4096, b"\0"), "not a 64-bit little-endian ELF"),
        (_elf(4096, shnum=0).ljust(4096, b"\0"), "no section header table"),
    ],
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
