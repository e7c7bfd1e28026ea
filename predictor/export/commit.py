"""Putting a proven package in place so that no kill, at any moment, leaves a state that jams.

The server checks a package against ``<name>.sha256`` when one is there and
stops start-up on a mismatch (:mod:`predictor.packages.digest`); ``histoserve
export --if_missing`` takes a package that fits. So a ``.pt2`` beside a
digest that is not its own is a crash loop no restart heals. The exporter
therefore writes everything beside the staged package, in its staging folder,
and moves it in this order (each step one ``rename`` or ``unlink``, atomic;
the data is ``fsync``-ed before the first and the folder after the last):

1. the gene lists (multimodal): a kill after this leaves lists that match
   what the next export writes, and no new package;
2. the old package at the output, if any, is removed: from here until step
   4 there is no ``.pt2`` under that name, only (at most) a digest, which no
   reader takes alone;
3. the new digest (``<name>.sha256``);
4. the new package.

Every state a kill can leave between two steps is one of: the old package
with its own digest, no package, or the new package with its own digest.
Folders a kill left behind are swept by the next export
(:mod:`predictor.export.scratch`). A package with a digest that is not its
own can still exist (one written before this order, or one edited by hand):
``--if_missing`` verifies the digest of the package it would take and
exports again over one that fails it (:mod:`predictor.export.package_set`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from predictor.packages.digest import sha256_file


def digest_path(package: Path) -> Path:
    """``<package>.sha256``, beside it."""
    return package.with_name(package.name + ".sha256")


def write_sha256(path: Path) -> Path:
    """Writes ``<path>.sha256`` as ``sha256sum`` does (``<hex>  <name>``), flushed to disk."""
    digest_file = digest_path(path)
    with digest_file.open("w", encoding="utf-8") as handle:
        handle.write(f"{sha256_file(path)}  {path.name}\n")
        handle.flush()
        os.fsync(handle.fileno())
    return digest_file


def commit(staged: Path, output: Path, extras: Sequence[Path] = ()) -> None:
    """Moves ``staged`` (a proven package) to ``output`` with its digest, in the module's order.

    Args:
        staged: The package in its staging folder (same file system as ``output``).
        output: Where it goes.
        extras: Other staged files that go beside it under their own names
            (the gene lists), moved first.
    """
    folder = output.parent
    for extra in extras:
        _fsync(extra)
        os.replace(extra, folder / extra.name)
    _fsync(staged)
    staged_digest = write_sha256(staged)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(output)
    os.replace(staged_digest, digest_path(output))
    os.replace(staged, output)
    _fsync_folder(folder)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot sync a folder
        _fsync(folder)
