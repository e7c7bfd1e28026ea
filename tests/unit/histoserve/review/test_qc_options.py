"""The QC, masks and bad-tile options: flags to config, checks, the manifest's ``mask`` column."""

from __future__ import annotations

from pathlib import Path

import pytest

from histoserve.commands.embed import build_parser, config_from_args
from histoserve.embedding.config import EmbedConfig
from histoserve.errors import UsageError
from histoserve.slides.manifest import read_manifest

URL = ("--url", "http://127.0.0.1:9")


def _config(*argv: str) -> EmbedConfig:
    return config_from_args(build_parser().parse_args(list(argv)), {})


def test_flags_reach_the_config(tmp_path: Path) -> None:
    config = _config(
        "a.svs", *URL, "--out", str(tmp_path), "--masks", str(tmp_path),
        "--accept-bad-tiles", "3", "--no-qc",
    )  # fmt: skip
    assert (config.masks, config.accept_bad_tiles, config.qc) == (tmp_path, 3, False)
    default = _config("a.svs", *URL, "--out", str(tmp_path))
    assert (default.masks, default.accept_bad_tiles, default.qc) == (None, 0, True)


def test_bad_values_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--accept-bad-tiles must be >= 0"):
        EmbedConfig(urls=("http://h:1",), out_dir=tmp_path, slides=("a.svs",), accept_bad_tiles=-1)
    with pytest.raises(UsageError, match=r"--masks .*not a folder"):
        EmbedConfig(urls=("http://h:1",), out_dir=tmp_path, slides=("a.svs",), masks=tmp_path / "x")


def test_manifest_mask_column_is_resolved_against_its_folder(tmp_path: Path) -> None:
    manifest = tmp_path / "slides.csv"
    manifest.write_text("slide_id,path,mask\nA,a.svs,masks/A.geojson\nB,/abs/b.svs,\n")
    a, b = read_manifest(manifest)
    assert a.mask == tmp_path / "masks" / "A.geojson" and b.mask is None
