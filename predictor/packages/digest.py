"""SHA-256 of ``.pt2`` packages: computed for the exporter, verified and reported at start-up.

A package holds a shared library that runs on load, so a package whose
``<name>.sha256`` does not match stops start-up. Start-up hashes the package
exactly once (see :func:`predictor.startup.build_model`), with or without a
digest file: the server reports the digest (``package_sha256`` in
``GET /v2/models/{name}/config``) so that clients such as ``histoserve embed``
record which package made their features and re-embed when it changes. The
one streamed read also warms the page cache for the extraction that follows.
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


def expected_sha256(path: Path) -> str | None:
    """The digest in ``<path>.sha256`` (``sha256sum`` format), or ``None`` without one.

    Raises:
        CheckpointError: The digest file is unreadable or holds no hex digest.
    """
    digest_file = Path(path).with_name(Path(path).name + ".sha256")
    if not digest_file.exists():
        return None
    try:
        fields = digest_file.read_text(encoding="utf-8").split()
    except OSError as exc:
        raise CheckpointError(f"cannot read {digest_file}: {exc}") from exc
    expected = fields[0].lower() if fields else ""
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise CheckpointError(
            f"{digest_file} does not start with a SHA-256 hex digest: {expected!r}"
        )
    return expected


def package_sha256(path: Path) -> str:
    """Hashes the package once and checks it against ``<path>.sha256`` when present.

    Returns:
        The package's hex SHA-256.

    Raises:
        CheckpointError: Unreadable package or digest file, or a mismatch
            (the package is tampered or truncated).
    """
    path = Path(path)
    expected = expected_sha256(path)
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if expected is not None and actual != expected:
        raise CheckpointError(
            f"checkpoint {path} is tampered or truncated: sha256 {actual} != {expected} "
            f"in {path.name}.sha256"
        )
    return actual


def verify_sha256(path: Path) -> bool:
    """Checks ``path`` against ``<path>.sha256`` when that file exists.

    Returns:
        ``True`` when a digest file was present and matched, ``False`` when
        there is none (nothing to check, nothing hashed).

    Raises:
        CheckpointError: Unreadable or malformed digest file, or a mismatch.
    """
    if expected_sha256(path) is None:
        return False
    package_sha256(path)
    return True
