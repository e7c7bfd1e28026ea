"""Where a package keeps its weights: in its model library's data section, or appended to it.

AOTInductor links a package's weights (its constants) into the data section
of the model library (the ``.so``) when they total at most 2 GB (torch's own
limit); larger ones cannot be linked there, so torch, whatever is asked,
appends them to the library file, which maps them from itself when loaded
(``aot_inductor.force_mmap_weights`` asks for that at any size). A CUDA
package's constants are copied to the device by the model container's
constructor either way, from a different source: the loaded data section, or
the mapped file. That upload is one suspect of the loader crash seen on an
H200 (``docs/performance.md``, "GPU"), and ``mmap`` the layout to try there.

``histoserve export --weights_layout`` chooses (:data:`LAYOUTS`: ``auto``
embeds up to :data:`AUTO_MAPS_ABOVE_BYTES` and maps above, ``mmap`` always maps); the package
records the result in its provenance (``weights_layout``: ``embedded`` or
``mmap``) and the exporter reads it back from the library itself
(:func:`library_layout`) before writing the package, so what is recorded is
what was built.
"""

from __future__ import annotations

import argparse
import struct
import zipfile
from pathlib import Path
from typing import Any

from predictor.errors import CheckpointError
from predictor.packages.extract import find_member

__all__ = [
    "AUTO",
    "EMBEDDED",
    "FLAG",
    "LAYOUTS",
    "MAPPED",
    "add_flag",
    "inductor_configs",
    "library_layout",
    "resolve",
]

AUTO = "auto"
EMBEDDED = "embedded"
MAPPED = "mmap"
LAYOUTS = (AUTO, MAPPED)
"""``histoserve export --weights_layout``'s choices."""
FLAG = "--weights_layout"

AUTO_MAPS_ABOVE_BYTES = 1_900_000_000
"""``auto`` maps from here: the count of :func:`resolve`'s caller is close to torch's, not
equal (torch pads each constant), so ``auto`` never leaves the choice to torch's rule."""

_ELF_HEADER = struct.Struct("<4sBB34xQ10xHH")  # magic, class, data, e_shoff, e_shentsize, e_shnum
_ELF_64_LITTLE = (2, 1)


def resolve(requested: str, constants_bytes: int) -> str:
    """The layout a package gets: ``mmap`` when asked or near torch's limit, else ``embedded``.

    Raises:
        ValueError: ``requested`` is not one of :data:`LAYOUTS`.
    """
    if requested not in LAYOUTS:
        raise ValueError(f"unknown weights layout {requested!r}; expected one of {list(LAYOUTS)}")
    return MAPPED if requested == MAPPED or constants_bytes > AUTO_MAPS_ABOVE_BYTES else EMBEDDED


def add_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """Adds :data:`FLAG` (default ``auto``) to a command that exports packages."""
    parser.add_argument(FLAG, default=AUTO, choices=LAYOUTS, help=help)


def inductor_configs(layout: str) -> dict[str, Any]:
    """The inductor options that build ``layout`` (``embedded`` is torch's default under the limit)."""
    return {"aot_inductor.force_mmap_weights": True} if layout == MAPPED else {}


def library_layout(path: Path, model_name: str = "model") -> str:
    """The layout a package's library was built with: ``mmap`` when bytes follow its ELF image.

    The ELF image ends with its section header table; torch appends mapped
    weights after it, so an embedded library ends exactly there. Only the
    header's first 64 bytes are read.

    Raises:
        CheckpointError: No model library in the package, one that is not a
            64-bit little-endian ELF file, or one without a section header table.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            name = find_member(archive.namelist(), model_name, ".so", path)
            size = archive.getinfo(name).file_size
            with archive.open(name) as library:
                header = library.read(_ELF_HEADER.size)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: its model library cannot be read: {exc}"
        ) from exc
    if len(header) < _ELF_HEADER.size:
        raise CheckpointError(f"checkpoint {path}: {name} is shorter than an ELF header")
    magic, elf_class, data, shoff, shentsize, shnum = _ELF_HEADER.unpack(header)
    if magic != b"\x7fELF" or (elf_class, data) != _ELF_64_LITTLE:
        raise CheckpointError(
            f"checkpoint {path}: {name} is not a 64-bit little-endian ELF library"
        )
    if shoff == 0 or shnum == 0:
        raise CheckpointError(
            f"checkpoint {path}: {name} has no section header table, so where its image ends "
            f"(and whether weights follow it) cannot be read"
        )
    return MAPPED if size > shoff + shentsize * shnum else EMBEDDED
