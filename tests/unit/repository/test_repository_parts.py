"""The model repository's parts that need no server: layout, settings, budget, control mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from predictor.config import BatchingConfig, LimitsConfig, ModelConfig, RepositoryConfig
from predictor.errors import ConfigError, InvalidInput, LoadRefused
from predictor.repository.layout import check_name, model_folders
from predictor.repository.memory import MemoryMeter
from predictor.repository.repository import Repository
from predictor.repository.settings import model_settings


def _folders(root: Path) -> Path:
    for name in ("a", "b"):
        (root / name).mkdir()
        (root / name / f"{name}.pt2").write_bytes(b"x" * 10)
    (root / "lost+found").mkdir()
    (root / "notes.txt").write_text("")
    return root


def test_a_pt2_in_the_model_dir_keeps_the_one_model_layout(tmp_path):
    _folders(tmp_path)
    assert set(model_folders(tmp_path, None) or {}) == {"a", "b"}
    assert model_folders(tmp_path, "a.pt2") is None
    (tmp_path / "top.pt2").write_bytes(b"x")
    assert model_folders(tmp_path, None) is None


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/etc", "notes.txt", "lost+found", "zz", ""])
def test_a_bad_name_is_invalid_input_naming_it(tmp_path, name):
    folders = model_folders(_folders(tmp_path), None) or {}
    with pytest.raises(InvalidInput) as err:
        check_name(name, tmp_path, folders)
    assert f"model {name!r}" in str(err.value) and "model_name" in str(err.value)


def test_a_settings_file_overrides_the_server_and_refuses_unknown_keys(tmp_path):
    (tmp_path / "histoserve.json").write_text(
        json.dumps({"max_batch_size": 4, "max_queue_delay_ms": [0, 500], "model_class": "m:C"})
    )
    model, batching = model_settings("a", tmp_path, ModelConfig(), BatchingConfig())
    assert (batching.max_batch_size, batching.max_queue_delay_ms) == (4, (0.0, 500.0))
    assert (model.model_class, model.model_name, model.model_dir) == ("m:C", "a", tmp_path)
    (tmp_path / "histoserve.json").write_text(json.dumps({"max_batch_size": 4, "device": "cuda"}))
    with pytest.raises(ConfigError, match=r"histoserve.json: unknown setting 'device'"):
        model_settings("a", tmp_path, ModelConfig(), BatchingConfig())
    (tmp_path / "histoserve.json").write_text(json.dumps({"max_batch_size": 0}))
    with pytest.raises(ConfigError, match=r"histoserve.json: max_batch_size must be >= 1"):
        model_settings("a", tmp_path, ModelConfig(), BatchingConfig())


def test_model_settings_files_go_over_the_folder_s_own(tmp_path):
    """``--model_settings DIR``: ``DIR/<name>.json`` (the chart's) over the folder's file."""
    folder, chart = tmp_path / "a", tmp_path / "chart"
    folder.mkdir(), chart.mkdir()
    (folder / "histoserve.json").write_text(json.dumps({"max_batch_size": 4, "spec": "h0-mini"}))
    (chart / "a.json").write_text(json.dumps({"max_batch_size": 8, "max_latency_ms": 2}))
    (chart / "b.json").write_text(json.dumps({"max_batch_size": 1}))  # another model's
    model, batching = model_settings("a", folder, ModelConfig(), BatchingConfig(), chart)
    assert (batching.max_batch_size, batching.max_latency_ms, model.spec) == (8, 2, "h0-mini")
    (chart / "a.json").write_text(json.dumps({"name": "b"}))
    with pytest.raises(ConfigError, match=r"chart/a.json: unknown setting 'name'"):
        model_settings("a", folder, ModelConfig(), BatchingConfig(), chart)
    assert RepositoryConfig(model_settings=str(chart)).settings_dir == chart


@pytest.mark.parametrize(
    ("value", "device", "expected"),
    [("90%", 1000, 900), ("8GiB", 1, 8 << 30), ("512MB", 1, 512 * 10**6), ("1000", 1, 1000)],
)
def test_memory_budget_values(value, device, expected):
    assert RepositoryConfig(memory_budget=value).budget_of(device) == expected


@pytest.mark.parametrize("value", ["0%", "120%", "lots", "-5", "8XB"])
def test_a_malformed_memory_budget_is_a_config_error(value):
    with pytest.raises(ConfigError, match="memory_budget"):
        RepositoryConfig(memory_budget=value)


def test_model_control_none_refuses_load_and_unload_naming_the_flag(tmp_path):
    folders = model_folders(_folders(tmp_path), None) or {}
    repository = Repository(
        tmp_path,
        folders,
        (ModelConfig(), BatchingConfig(), LimitsConfig()),
        RepositoryConfig(),
        build=lambda *configs: pytest.fail("nothing may load"),
        meter=MemoryMeter(torch.device("cpu")),
        drain_timeout_s=1.0,
    )
    for call in (repository.load, repository.unload):
        with pytest.raises(LoadRefused, match="not allowed with --model_control none"):
            asyncio.run(call("a"))


class _SlowModel:
    """A built model whose start and drain take ``hold`` (an event the test sets)."""

    def __init__(self, hold: asyncio.Event):
        self.hold, self.started, self.stopped = hold, False, False

    async def start_batching(self) -> None:
        await self.hold.wait()
        self.started = True

    async def drain(self, timeout_s: float, why: str) -> bool:
        await self.hold.wait()
        return True

    def stop(self) -> None:
        self.stopped = True


def _explicit(tmp_path: Path, built: list[_SlowModel], hold: asyncio.Event) -> Repository:
    folders = model_folders(_folders(tmp_path), None) or {}

    def build(*configs: object) -> _SlowModel:
        built.append(_SlowModel(hold))
        return built[-1]

    return Repository(
        tmp_path,
        folders,
        (ModelConfig(), BatchingConfig(), LimitsConfig()),
        RepositoryConfig(model_control="explicit"),
        build=build,
        meter=MemoryMeter(torch.device("cpu")),
        drain_timeout_s=1.0,
    )


def test_a_caller_gone_mid_load_or_unload_leaves_it_to_finish(tmp_path):
    """A gRPC client's deadline cancels its call, never the load or unload half way: the
    model ends READY and published, then UNAVAILABLE and stopped (never stuck)."""
    built: list[_SlowModel] = []
    published: list[object] = []
    withdrawn: list[str] = []

    async def body() -> None:
        hold = asyncio.Event()
        repository = _explicit(tmp_path, built, hold)
        repository.attach(published.append, withdrawn.append)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(repository.load("a"), 0.2)  # the caller gives up
        hold.set()
        await asyncio.sleep(0.2)
        (row,) = [r for r in await repository.index() if r["name"] == "a"]
        assert row["state"] == "READY" and published == built and built[0].started
        hold.clear()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(repository.unload("a"), 0.2)
        hold.set()
        await asyncio.sleep(0.2)
        (row,) = [r for r in await repository.index() if r["name"] == "a"]
        assert row["state"] == "UNAVAILABLE" and withdrawn == ["a"] and built[0].stopped
        await repository.load("a")  # and it loads again
        assert len(published) == 2

    asyncio.run(body())
