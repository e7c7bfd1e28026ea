"""SHA-256 of ``.pt2`` packages: computed for the exporter, verified at start-up.

A package holds a shared library that runs on load, so a package whose
``<name>.sha256`` does not match stops start-up. Hashing a multi-GB package
takes seconds, so start-up does it exactly once (see
:func:`predictor.startup.build_model`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from predictor.errors import CheckpointError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, streamed in 1 MiB chunks (packages can be GBs)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path) -> bool:
    """Checks ``path`` against ``<path>.sha256`` when that file exists.

    The digest file holds the hex digest, optionally followed by the file name
    (``sha256sum`` format). A package holds a shared library that runs on
    load, so a mismatch stops start-up.

    Returns:
        ``True`` when a digest file was present and matched, ``False`` when
        there is none (nothing to check).

    Raises:
        CheckpointError: Unreadable or malformed digest file, or a mismatch
            (the package is tampered or truncated).
    """
    path = Path(path)
    digest_file = path.with_name(path.name + ".sha256")
    if not digest_file.exists():
        return False
    try:
        fields = digest_file.read_text(encoding="utf-8").split()
    except OSError as exc:
        raise CheckpointError(f"cannot read {digest_file}: {exc}") from exc
    expected = fields[0].lower() if fields else ""
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise CheckpointError(
            f"{digest_file} does not start with a SHA-256 hex digest: {expected!r}"
        )
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if actual != expected:
        raise CheckpointError(
            f"checkpoint {path} is tampered or truncated: sha256 {actual} != {expected} in {digest_file.name}"
        )
    return True
