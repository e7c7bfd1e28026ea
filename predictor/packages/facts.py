"""What start-up learns of a package before loading it: which files, their one hash, metadata, batch range.

The order is :func:`find_candidates` (the named file, or every ``*.pt2`` of
the model directory: several are a package set, and
:mod:`predictor.packages.package_set` chooses), then :func:`inspect_package`
(the one SHA-256 of start-up, checked against a ``.sha256`` file when there
is one and reported to clients, :mod:`predictor.packages.digest`: a package
holds a shared library, so loading one runs its code; then the metadata, read
straight from the zip). Nothing here loads or runs a package (that is
:mod:`predictor.runtime.loader`), and nothing imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from predictor.errors import CheckpointError, IncompatiblePackage
from predictor.packages.digest import package_sha256
from predictor.packages.metadata import provenance, read_metadata
from predictor.packages.phases import StartupPhases


def find_candidates(model_dir: Path, checkpoint: str | None) -> tuple[Path, ...]:
    """The packages start-up may serve: ``model_dir/checkpoint``, or every ``*.pt2`` there.

    Several are a package set: :func:`predictor.packages.package_set.choose_package`
    takes the one that fits.

    Raises:
        CheckpointError: The directory or named file is missing, the name
            escapes the directory, or there is no ``*.pt2`` and no name was given.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist")
    if checkpoint:
        path = model_dir / checkpoint
        if Path(checkpoint).is_absolute() or ".." in Path(checkpoint).parts:
            raise CheckpointError(
                f"checkpoint {checkpoint!r} must be a file name inside {model_dir}"
            )
        if not path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint!r} not found in {model_dir}")
        return (path,)
    candidates = tuple(sorted(p for p in model_dir.glob("*.pt2") if p.is_file()))
    if not candidates:
        raise CheckpointError(
            f"no *.pt2 checkpoint in {model_dir}; export one with "
            f"histoserve export --spec SPEC <--demo|--timm ARCH|--module M> --package_set {model_dir}"
        )
    return candidates


@dataclass(frozen=True)
class PackageFacts:
    """What start-up learns of a package before loading it.

    Attributes:
        metadata: Its AOTInductor metadata, read from the zip.
        sha256: Its hex SHA-256 (the one hash of start-up).
    """

    metadata: Mapping[str, str]
    sha256: str


def inspect_package(
    path: Path, phases: StartupPhases, metadata: Mapping[str, str] | None = None
) -> PackageFacts:
    """Hashes the package (the only hash of start-up; checked against a
    ``.sha256`` file when present) and reads its metadata (unless ``metadata``
    was read already, when start-up chose it among a package set).

    Nothing of the package is loaded or run.

    Raises:
        CheckpointError: Digest mismatch or malformed digest file, or a zip
            that is corrupt, truncated or holds no AOTInductor metadata.
    """
    with phases.time("digest"):
        sha256 = package_sha256(path)
    with phases.time("metadata"):
        read = dict(metadata) if metadata is not None else read_metadata(path)
        return PackageFacts(metadata=read, sha256=sha256)


def check_batch_size(metadata: Mapping[str, str], max_batch_size: int) -> None:
    """Refuses a batch bound above the batch range the package was exported for.

    ``max_batch_size`` is the most items the server puts in one forward: the
    model's ``--max_batch_size`` as its family resolves it (a slide head's
    one slide, whose tiles its family bounds by this range itself), never the
    raw flag. Every full batch would fail the package's own input check, and because
    the generated code checks its inputs before it takes ownership of them,
    each failed call also leaks the whole input batch. Packages that record
    no range (built elsewhere) are not checked.

    Raises:
        IncompatiblePackage: One line naming both numbers.
    """
    prov = provenance(metadata)
    if "max_batch" not in prov:
        return
    low, high = int(prov.get("min_batch", 1)), int(prov["max_batch"])
    if max_batch_size > high:
        raise IncompatiblePackage(
            f"--max_batch_size {max_batch_size} is above the batch range the package was "
            f"exported for ({low}..{high}); serve with --max_batch_size {high} or less, "
            f"or re-export with --max_batch {max_batch_size}"
        )
