"""Gene-list CSVs beside multimodal packages: written, read back, refused with the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.errors import CheckpointError
from predictor.families.multimodal.genes import (
    demo_gene_ids,
    parse_gene_ids,
    read_gene_ids,
    write_gene_ids,
)


def test_gene_lists_roundtrip(tmp_path: Path) -> None:
    ids = demo_gene_ids(5)
    assert ids[0] == "ENSG00000000001" and len(set(ids)) == 5
    path = write_gene_ids(tmp_path / "genes.csv", ids)
    assert path.read_text().splitlines()[0] == "gene_id"
    assert read_gene_ids(path) == ids
    assert parse_gene_ids("gene_id\nENSG00000141510.17\nENSMUSG00000059552\n") == (
        "ENSG00000141510.17",
        "ENSMUSG00000059552",
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("gene_id\n", "no genes"),
        ("symbol\nTP53\n", "first row must be 'gene_id'"),
        ("gene_id\nENSG00000141510\nTP53\n", "line 3: 'TP53' is not an Ensembl gene ID"),
        ("gene_id\nENSG00000141510\nENSG00000141510\n", "duplicate gene 'ENSG00000141510'"),
    ],
)
def test_bad_gene_lists(text: str, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle):
        parse_gene_ids(text, source="genes.csv")


def test_gene_list_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read gene list"):
        read_gene_ids(tmp_path / "missing.csv")
    with pytest.raises(CheckpointError, match="empty gene list"):
        write_gene_ids(tmp_path / "g.csv", [])
    with pytest.raises(CheckpointError, match="n >= 1"):
        demo_gene_ids(0)
    assert not (tmp_path / "g.csv").exists()
