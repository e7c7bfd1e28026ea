"""EmbedConfig: every option validated with the flag and value in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from histoserve.embedding.config import DEFAULT_CONCURRENCY_PER_URL, EmbedConfig
from histoserve.errors import UsageError

BASE = {"urls": ("http://127.0.0.1:8080",), "out_dir": Path("out"), "slides": (Path("a.svs"),)}


def test_defaults_follow_urls_and_workers() -> None:
    config = EmbedConfig(**{**BASE, "urls": ("http://a:1", "grpc://b:2")}, read_workers=3)
    assert config.concurrency == 2 * DEFAULT_CONCURRENCY_PER_URL
    assert config.queue_batches == 3
    assert config.tissue_method == "otsu"
    assert EmbedConfig(**BASE, tissue="tissue-seg").tissue_method == "model"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"urls": ()}, "no server given"),
        ({"urls": ("localhost:8080",)}, "'localhost:8080'"),
        ({"urls": ("http://",)}, "'http://'"),
        ({"slides": ()}, "no slides given"),
        ({"mode": "logits"}, "--mode 'logits'"),
        ({"progress": "fancy"}, "--progress 'fancy'"),
        ({"tissue": ""}, "--tissue"),
        ({"shard": (3, 3)}, "--shard 3/3"),
        ({"target_mpp": 0.0}, "--target-mpp must be > 0, got 0.0"),
        ({"mpp_override": -1.0}, "--mpp-override must be > 0, got -1.0"),
        ({"batch_size": 0}, "--batch-size must be >= 1, got 0"),
        ({"tile_size": 0}, "--tile-size must be >= 1, got 0"),
        ({"concurrency": -2}, "--concurrency must be >= 1 (0: the default), got -2"),
        ({"read_workers": -1}, "--read-workers"),
        ({"mpp_tolerance": 1.5}, "--mpp-tolerance must be in [0, 1), got 1.5"),
        ({"min_tissue": 2.0}, "--min-tissue must be in [0, 1], got 2.0"),
        ({"max_attempts": 0}, "--max-attempts must be >= 1, got 0"),
        ({"recycle_s": 0.0}, "--recycle-s must be > 0, got 0.0"),
        ({"slides_in_flight": 0}, "--slides-in-flight must be >= 1, got 0"),
    ],
)
def test_bad_values_are_usage_errors(changes: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        EmbedConfig(**{**BASE, **changes})
    assert message in str(info.value)


def test_manifest_alone_is_enough_and_frozen() -> None:
    config = EmbedConfig(urls=["grpc://h:1"], out_dir="o", manifest="m.csv")
    assert config.manifest == Path("m.csv") and config.urls == ("grpc://h:1",)
    with pytest.raises(AttributeError):
        config.batch_size = 3  # type: ignore[misc]
