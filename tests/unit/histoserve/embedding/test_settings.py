"""The declared run settings: one record, one resume hash, one diff that names each field."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from histoserve.embedding.config import EmbedConfig
from histoserve.embedding.settings import RUN_SETTINGS, differences, run_settings, slide_settings
from histoserve.remote.served_model import ServerInfo
from histoserve.results.output import config_hash
from histoserve.slides.manifest import SlideEntry
from histoserve.tissue.detect import OTSU_VERSION


def _ctx(tmp_path: Path, **config: object) -> SimpleNamespace:
    cfg = EmbedConfig(
        urls=("http://h:1",), out_dir=tmp_path, slides=(tmp_path / "a.svs",), **config
    )
    info = ServerInfo("h0-mini", "embedding", 224, 0.5, ("embedding",), package_sha256="ab" * 32)
    return SimpleNamespace(
        config=cfg, info=info, tissue_info=None, target_mpp=cfg.target_mpp or 0.5, tile_size=224
    )


def _legacy(ctx: SimpleNamespace, **extra: object) -> dict[str, object]:
    """The resume hash's inputs as histoserve wrote them before the settings were declared."""
    cfg = ctx.config
    return {
        "model": "h0-mini", "package_sha256": "ab" * 32, "target_mpp": ctx.target_mpp,
        "tile_size": 224, "mode": cfg.mode, "tissue": cfg.tissue, "tissue_package": "",
        "min_tissue": cfg.min_tissue, "mpp_override": cfg.mpp_override,
        "mpp_tolerance": cfg.mpp_tolerance, "manifest_mpp": None, "bulk_rna_sha256": "",
        "resize_interpolation": "bicubic", "tissue_algorithm": OTSU_VERSION, **extra,
    }  # fmt: skip


def test_resume_hashes_stay_those_of_earlier_runs(tmp_path: Path) -> None:
    entry = SlideEntry("a", tmp_path / "a.svs")
    flat = _ctx(tmp_path)
    assert config_hash(slide_settings(flat, entry)) == config_hash(_legacy(flat))
    other = _ctx(tmp_path, layout="trident", overlap=16, target_mpp=1.0)
    want = _legacy(other, layout="trident", overlap=16)
    assert config_hash(slide_settings(other, entry)) == config_hash(want)


def test_the_record_holds_every_declared_setting(tmp_path: Path) -> None:
    record = run_settings(_ctx(tmp_path))
    assert list(record) == [s.key for s in RUN_SETTINGS]
    assert record["layout"] == "flat" and record["overlap"] == 0 and record["target_mpp"] == 0.5


def test_differences_name_each_field_old_to_new(tmp_path: Path) -> None:
    old = run_settings(_ctx(tmp_path))
    assert differences(old, dict(old)) == []
    new = run_settings(_ctx(tmp_path, target_mpp=1.0, layout="clam"))
    assert differences(old, new) == [
        "target mpp (--target-mpp): 0.5 -> 1.0",
        "layout (--layout): flat -> clam",
    ]


def test_an_absent_key_means_its_old_behaviour_and_unknown_keys_are_compared(
    tmp_path: Path,
) -> None:
    new = run_settings(_ctx(tmp_path))
    old = {k: v for k, v in new.items() if k not in ("layout", "overlap")}
    assert differences(old, new) == []  # a record from before these settings existed
    assert differences({**new, "later": "x"}, new) == ["later: x -> (none)"]
    assert differences({**new, "mpp_override": None}, {**new, "mpp_override": 0.25}) == [
        "mpp override (--mpp-override): (none) -> 0.25"
    ]
