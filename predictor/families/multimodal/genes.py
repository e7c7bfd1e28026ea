"""Gene-list CSVs: the input/output gene order of a multimodal package.

A multimodal package (m-optimus) takes bulk RNA as ``[B, G]`` and predicts
``[B, K]`` genes; which gene each column is ships beside the checkpoint as two
CSVs (``spec.genes_in_file`` / ``spec.genes_out_file``). Each is one Ensembl
gene ID per row under the header ``gene_id``. The runtime checks ``G`` and
``K`` against the package at start-up, so a wrong list fails fast instead of
silently mislabelling predictions.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

from predictor.errors import CheckpointError, SpecError, SpecMismatch
from predictor.spec import ModelSpec

HEADER = "gene_id"

# Ensembl gene IDs: a species prefix (ENSG for human, ENSMUSG, ...) then 11
# digits, optionally a version suffix (".14").
_GENE_ID = re.compile(r"^ENS[A-Z]*G\d{11}(\.\d+)?$")


def parse_gene_ids(text: str, *, source: str = "<text>") -> tuple[str, ...]:
    """Parses a gene-list CSV's text into its IDs, in order.

    Args:
        text: The CSV text: header ``gene_id`` then one ID per row.
        source: What to call the list in error messages (usually the path).

    Returns:
        The gene IDs, in file order (the column order of the tensor).

    Raises:
        CheckpointError: Wrong header, empty list, malformed or duplicate ID.
    """
    rows = [row for row in csv.reader(io.StringIO(text)) if row and any(c.strip() for c in row)]
    if not rows:
        raise CheckpointError(f"gene list {source} is empty (expected header {HEADER!r})")
    header = [c.strip() for c in rows[0]]
    if header[:1] != [HEADER]:
        raise CheckpointError(f"gene list {source}: first row must be {HEADER!r}, got {rows[0]!r}")
    ids = tuple(row[0].strip() for row in rows[1:])
    if not ids:
        raise CheckpointError(f"gene list {source} has a header but no genes")
    _check_ids(ids, source)
    return ids


def _check_ids(ids: Sequence[str], source: str) -> None:
    seen: dict[str, int] = {}
    for line, gene in enumerate(ids, start=2):
        if not _GENE_ID.match(gene):
            raise CheckpointError(
                f"gene list {source} line {line}: {gene!r} is not an Ensembl gene ID (ENSG...)"
            )
        if gene in seen:
            raise CheckpointError(
                f"gene list {source} line {line}: duplicate gene {gene!r} (first on line {seen[gene]})"
            )
        seen[gene] = line


def read_gene_ids(path: Path) -> tuple[str, ...]:
    """Reads a gene-list CSV (see :func:`parse_gene_ids`).

    Raises:
        CheckpointError: The file is missing or unreadable, or its content is
            invalid; the message names the path.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise CheckpointError(f"cannot read gene list {path}: {exc}") from exc
    return parse_gene_ids(text, source=str(path))


def write_gene_ids(path: Path, gene_ids: Sequence[str]) -> Path:
    """Writes a gene-list CSV that :func:`read_gene_ids` reads back unchanged.

    Raises:
        CheckpointError: The IDs are empty, malformed or duplicated (nothing
            is written then).
    """
    ids = tuple(gene_ids)
    if not ids:
        raise CheckpointError(f"refusing to write an empty gene list to {path}")
    _check_ids(ids, str(path))
    path = Path(path)
    path.write_text("\n".join((HEADER, *ids)) + "\n", encoding="utf-8")
    return path


def demo_gene_ids(n: int, prefix: str = "ENSG") -> tuple[str, ...]:
    """``n`` distinct, well-formed Ensembl-style IDs for demo packages.

    Args:
        n: How many IDs (``>= 1``).
        prefix: Species prefix ending in ``G`` (``ENSG``, ``ENSMUSG``).

    Raises:
        CheckpointError: ``n < 1`` or a prefix that would not form valid IDs.
    """
    if n < 1:
        raise CheckpointError(f"demo gene list needs n >= 1, got {n}")
    ids = tuple(f"{prefix}{i:011d}" for i in range(1, n + 1))
    if not _GENE_ID.match(ids[0]):
        raise CheckpointError(
            f"demo gene prefix {prefix!r} does not form Ensembl IDs (e.g. 'ENSG')"
        )
    return ids


def gene_lists_for(
    spec: ModelSpec,
    genes_in: int,
    genes_out: int,
    given: tuple[Sequence[str], Sequence[str]] | None,
) -> tuple[Sequence[str], Sequence[str]]:
    """The gene lists a multimodal export ships: ``given`` or demo IDs, sized ``genes_in``/``genes_out``.

    Raises:
        SpecError: The spec names no gene files.
        SpecMismatch: A given list's length differs from the model's.
    """
    if not spec.genes_in_file or not spec.genes_out_file:
        raise SpecError(
            f"spec {spec.name!r} is multimodal but names no genes_in_file/genes_out_file"
        )
    ids_in, ids_out = given or (demo_gene_ids(genes_in), demo_gene_ids(genes_out))
    for label, ids, count in (("input", ids_in, genes_in), ("output", ids_out, genes_out)):
        if len(ids) != count:
            raise SpecMismatch(
                f"the {label} gene list has {len(ids)} genes but the model uses {count}"
            )
    return ids_in, ids_out


def write_gene_lists(
    spec: ModelSpec, directory: Path, genes_in: Sequence[str], genes_out: Sequence[str]
) -> tuple[Path, Path]:
    """Writes the spec's input/output gene CSVs (``genes_in_file``/``genes_out_file``) into ``directory``.

    Raises:
        SpecError: The spec names no gene files.
        CheckpointError: Empty, malformed or duplicate gene IDs.
    """
    if not spec.genes_in_file or not spec.genes_out_file:
        raise SpecError(f"spec {spec.name!r} names no genes_in_file/genes_out_file")
    return (
        write_gene_ids(directory / spec.genes_in_file, genes_in),
        write_gene_ids(directory / spec.genes_out_file, genes_out),
    )
