"""A package's metadata is read bounded: its size before reading, its nesting in C.

The packages here are crafted zips (what a corrupt or hostile file in a model
volume is): only the metadata member matters before the loader runs.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from predictor.errors import CheckpointError
from predictor.packages.build_key import key_from_metadata
from predictor.packages.metadata import MAX_METADATA_BYTES, provenance, read_metadata
from predictor.spec import METADATA_KEY

MEMBER = "h0/data/aotinductor/model/cxyz_metadata.json"


def package(tmp_path: Path, metadata: bytes, name: str = "p.pt2") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MEMBER, metadata)
    return path


def test_plain_metadata_is_read(tmp_path: Path) -> None:
    path = package(tmp_path, json.dumps({"AOTI_DEVICE_KEY": "cpu"}).encode())
    assert read_metadata(path) == {"AOTI_DEVICE_KEY": "cpu"}


def test_a_member_declaring_more_than_the_bound_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    """Spaces compress ~1000x: a 4 KB file that would inflate to 5 MB."""
    path = package(tmp_path, b"{" + b" " * (MAX_METADATA_BYTES + 1) + b"}")
    assert path.stat().st_size < 64 << 10
    with pytest.raises(CheckpointError, match=r"p\.pt2: metadata .* declares 4,194,3\d\d bytes"):
        read_metadata(path)


def test_deep_metadata_is_a_named_checkpoint_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = package(tmp_path, b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(CheckpointError, match=r"p\.pt2: metadata .* is not valid JSON"):
        read_metadata(path)


def test_a_deep_json_field_is_a_named_checkpoint_error() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(CheckpointError, match=r"package metadata 'histoserve.provenance'"):
        provenance({"histoserve.provenance": deep})
    with pytest.raises(CheckpointError, match="the package's embedded spec"):
        key_from_metadata(
            {"histoserve.provenance": json.dumps({"torch_version": "2.13.0"}), METADATA_KEY: deep}
        )
