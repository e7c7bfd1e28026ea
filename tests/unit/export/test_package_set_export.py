"""``histoserve export --package_set``: one package per build key, exported once, never half.

The lock and the take-the-result path run with an export step that lands a
real cached package by stage-and-rename (a real export costs ~20 s; the
exporter itself is tested in ``test_build.py``, and a real concurrent export,
a killed one and two replicas in ``tests/integration/test_package_set_server.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from harness.factories import WEIGHTS_TARGET
from harness.package_sets import rewrite_metadata, write_weights
from harness.packages import demo_package
from predictor.errors import CheckpointError
from predictor.export import package_set
from predictor.export.build import main as export_main
from predictor.export.commit import commit
from predictor.export.sources import weights_digest
from predictor.packages.build_key import BuildKey, key_from_metadata
from predictor.packages.digest import package_sha256
from predictor.packages.metadata import read_metadata
from predictor.packages.weights_layout import library_layout


@pytest.fixture(scope="module")
def portable() -> tuple[Path, BuildKey]:
    """The cached x86-64-v3 demo package and its build key."""
    src = demo_package("h0-mini", cpu_target="x86-64-v3", max_batch=8)
    key = key_from_metadata(read_metadata(src))
    assert key is not None
    return src, key


def _landing(src: Path, calls: list[Path], gate: threading.Event | None = None):
    """An export step: waits for ``gate``, then stages a copy of ``src`` and renames it in."""

    def export(output: Path) -> Path:
        calls.append(output)
        if gate is not None:
            assert gate.wait(30)
        staged = output.with_name(".staging-" + output.name)
        shutil.copy2(src, staged)
        os.replace(staged, output)
        return output

    return export


def test_concurrent_exporters_of_one_key_export_once(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    src, key = portable
    calls: list[Path] = []
    gate = threading.Event()
    results: dict[str, tuple[Path, bool]] = {}

    def run(name: str) -> None:
        export = _landing(src, calls, gate)
        results[name] = package_set.export_into_set(tmp_path, key, export, lock_timeout_s=60)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    while not calls:  # the first holds the lock and is exporting
        first.join(0.05)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting on the lock, not exporting
    gate.set()
    first.join(30)
    second.join(30)
    target = tmp_path / f"{key.name}.pt2"
    assert results == {"first": (target, True), "second": (target, False)}
    assert calls == [target]
    assert sorted(p.name for p in tmp_path.glob("*.pt2")) == [target.name]


def test_a_held_lock_is_waited_for_only_so_long(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    src, key = portable
    (tmp_path / ".locks").mkdir()
    fd = os.open(tmp_path / ".locks" / f"{key.name}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        calls: list[Path] = []
        with pytest.raises(package_set.LockTimeout, match=key.name) as failed:
            package_set.export_into_set(tmp_path, key, _landing(src, calls), lock_timeout_s=0.5)
        assert "--lock_timeout_s" in str(failed.value) and not calls
    finally:
        os.close(fd)  # the holder dies: the lock goes with it
    path, exported = package_set.export_into_set(tmp_path, key, _landing(src, []), lock_timeout_s=5)
    assert exported and path.is_file()


def test_a_failed_export_leaves_no_package_and_frees_the_lock(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    src, key = portable

    def dies_midway(output: Path) -> Path:
        output.with_name(".export-partial").write_bytes(b"PK half")
        raise CheckpointError("AOTInductor compilation failed: killed")

    with pytest.raises(CheckpointError, match="compilation failed"):
        package_set.export_into_set(tmp_path, key, dies_midway, lock_timeout_s=5)
    assert not list(tmp_path.glob("*.pt2"))
    path, exported = package_set.export_into_set(tmp_path, key, _landing(src, []), lock_timeout_s=1)
    assert exported and key_from_metadata(read_metadata(path)) == key


def test_a_file_under_the_key_s_name_that_is_another_build_is_replaced(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    src, key = portable
    impostor = tmp_path / f"{key.name}.pt2"
    shutil.copy2(demo_package("h0-mini"), impostor)  # the native build under the v3 name
    calls: list[Path] = []
    path, exported = package_set.export_into_set(
        tmp_path, key, _landing(src, calls), lock_timeout_s=5
    )
    assert exported and calls == [impostor]
    assert key_from_metadata(read_metadata(path)) == key


def test_an_export_that_records_another_key_is_refused(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    _, key = portable
    with pytest.raises(CheckpointError, match="records another build key"):
        package_set.export_into_set(
            tmp_path, key, _landing(demo_package("h0-mini"), []), lock_timeout_s=5
        )


def test_a_set_that_cannot_be_written_says_so(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    src, key = portable
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(CheckpointError, match="must be writable to export into it"):
        package_set.export_into_set(tmp_path / "file", key, _landing(src, []), lock_timeout_s=1)


# -- the command line (refusals before any export) ----------------------------------------
def test_if_missing_takes_a_fitting_package_of_the_same_model(
    tmp_path: Path, portable: tuple[Path, BuildKey], capsys: pytest.CaptureFixture[str]
) -> None:
    src, key = portable
    shutil.copy2(src, tmp_path / f"{key.name}.pt2")
    argv = ["--spec", "h0-mini", "--demo", "--package_set", str(tmp_path), "--if_missing"]
    # native asked for (not there): the portable build of the same model fits, so nothing runs
    assert export_main([*argv, "--max_batch", "8"]) == 0
    assert "fits this host (by the server's rule): nothing to export" in capsys.readouterr().out
    assert [p.name for p in tmp_path.glob("*.pt2")] == [f"{key.name}.pt2"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--demo", "--output", "x.pt2", "--if_missing"], "--if_missing goes with --package_set"),
        (["--demo", "--package_set", "d", "--weights", "w.pt"], "--weights goes with --timm"),
        (["--module", WEIGHTS_TARGET, "--package_set", "d", "--weights", "nope.pt"], "nope.pt"),
        (["--demo", "--package_set", "d", "--device", "cuda"], "no usable CUDA GPU"),
    ],
)
def test_refused_package_set_commands(
    tmp_path: Path,
    argv: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert export_main(["--spec", "h0-mini", *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.pt2"))


def test_weights_that_do_not_fit_the_module_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = write_weights(tmp_path / "vit-s.pt", spec_name="h0-mini")
    wrong = tmp_path / "wrong.pt"
    state = torch.load(weights, weights_only=True)
    state.pop(next(iter(state)))
    torch.save(state, wrong)
    argv = ["--spec", "h0-mini", "--module", WEIGHTS_TARGET, "--weights", str(wrong)]
    assert export_main([*argv, "--package_set", str(tmp_path / "set")]) == 2
    assert "do not fit the --module model" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.pt2"))


def test_if_missing_wants_a_package_as_wide_as_asked(
    tmp_path: Path, portable: tuple[Path, BuildKey]
) -> None:
    """A fitting build whose batch range stops short of the one asked for does not count."""
    src, key = portable  # batches 1..8
    shutil.copy2(src, tmp_path / f"{key.name}.pt2")
    assert package_set.fitting_package(tmp_path, key) == tmp_path / f"{key.name}.pt2"
    wider = dataclasses.replace(key, max_batch=64, target="native-00000000")
    assert package_set.fitting_package(tmp_path, wider) is None
    other_weights = dataclasses.replace(key, weights="sha256:" + "0" * 64)
    assert package_set.fitting_package(tmp_path, other_weights) is None


def test_the_weights_digest_follows_the_file(tmp_path: Path) -> None:
    """Hashed once for the key and the export alike, and again when the file changes."""
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"first")
    assert weights_digest(weights) == hashlib.sha256(b"first").hexdigest()
    weights.write_bytes(b"second, longer")
    assert weights_digest(weights) == hashlib.sha256(b"second, longer").hexdigest()


def test_mapped_weights_asked_for_replace_a_package_of_the_key_with_embedded_ones(
    tmp_path: Path,
) -> None:
    """``--weights_layout mmap`` (the chart's ``model.build.weightsLayout``) takes effect in a set
    that already holds the build with embedded weights; ``auto`` takes either."""
    mapped = demo_package("h0-mini", weights_layout="mmap")
    key = key_from_metadata(read_metadata(mapped))
    assert key == key_from_metadata(read_metadata(demo_package("h0-mini")))  # one build key
    target = tmp_path / f"{key.name}.pt2"
    shutil.copy2(demo_package("h0-mini"), target)
    assert package_set.fitting_package(tmp_path, key) == target
    assert package_set.fitting_package(tmp_path, key, weights_layout="mmap") is None
    calls: list[Path] = []
    path, exported = package_set.export_into_set(
        tmp_path, key, _landing(mapped, calls), lock_timeout_s=5, weights_layout="mmap"
    )
    assert exported and calls == [target] and library_layout(path) == "mmap"
    for layout in ("mmap", "auto"):  # now there: taken either way
        again = package_set.export_into_set(
            tmp_path, key, _landing(mapped, calls), lock_timeout_s=5, weights_layout=layout
        )
        assert again == (target, False)
    assert package_set.fitting_package(tmp_path, key, weights_layout="mmap") == target


# -- kills between an export's renames, and mistyped packages beside it --------------------
def _digest_line(path: Path, name: str) -> str:
    return f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n"


def _landing_with_digest(src: Path, calls: list[Path]):
    """An export step that lands ``src`` and its ``.sha256`` (what a finished export leaves)."""
    land = _landing(src, calls)

    def export(output: Path) -> Path:
        land(output)
        output.with_name(output.name + ".sha256").write_text(_digest_line(output, output.name))
        return output

    return export


@pytest.mark.parametrize("digest", ["another package's", "empty"])
def test_if_missing_exports_again_over_a_package_that_fails_its_digest(
    tmp_path: Path, portable: tuple[Path, BuildKey], digest: str
) -> None:
    """What an exporter killed between writing the package and its digest left (the digest of
    the package it replaced, or a digest file opened and not yet written): the server refuses it
    ("tampered or truncated") on every start; --if_missing must not call it a fit."""
    src, key = portable
    target = tmp_path / f"{key.name}.pt2"
    shutil.copy2(src, target)
    other = demo_package("h0-mini")
    sidecar = target.with_name(target.name + ".sha256")
    sidecar.write_text(_digest_line(other, target.name) if digest != "empty" else "")
    with pytest.raises(CheckpointError):
        package_sha256(target)  # the server's check: the jam
    assert package_set.fitting_package(tmp_path, key) is None
    calls: list[Path] = []
    path, exported = package_set.export_into_set(
        tmp_path, key, _landing_with_digest(src, calls), lock_timeout_s=5
    )
    assert exported and calls == [target]
    assert package_sha256(path) == hashlib.sha256(src.read_bytes()).hexdigest()  # serves again
    assert package_set.fitting_package(tmp_path, key) == target


class Killed(BaseException):
    """The process stopping at this point: nothing after it runs (no except, no finally)."""


def test_no_kill_point_of_the_commit_leaves_a_package_beside_a_digest_not_its_own(
    tmp_path: Path, portable: tuple[Path, BuildKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step of putting a proven package in place (an unlink or a rename, replacing an
    older package of the name) is a kill point: each state left is the old package with its
    digest, no package, or the new one with its digest; --if_missing heals each."""
    new, _ = portable
    old = demo_package("h0-mini")
    steps, kill_at = [0], [0]
    real_replace, real_unlink = os.replace, os.unlink

    def step(real):
        def run(*args, **kwargs):
            steps[0] += 1
            if steps[0] == kill_at[0]:
                raise Killed
            return real(*args, **kwargs)

        return run

    monkeypatch.setattr(os, "replace", step(real_replace))
    monkeypatch.setattr(os, "unlink", step(real_unlink))
    states = set()
    for point in range(1, 5):
        folder = tmp_path / f"kill-{point}"
        folder.mkdir()
        output = folder / "m.pt2"
        shutil.copy2(old, output)
        output.with_name("m.pt2.sha256").write_text(_digest_line(output, "m.pt2"))
        staging = folder / ".export-x"
        staging.mkdir()
        shutil.copy2(new, staging / "m.pt2")
        steps[0], kill_at[0] = 0, point
        with contextlib.suppress(Killed):
            commit(staging / "m.pt2", output)
        if not output.exists():
            states.add("no package")
            continue
        package_sha256(output)  # the server's digest check passes: never a jam
        states.add("new" if output.read_bytes() == new.read_bytes() else "old")
    assert states == {"old", "no package", "new"}, states


def test_if_missing_judges_past_mistyped_packages_without_a_traceback(
    tmp_path: Path, portable: tuple[Path, BuildKey], capsys: pytest.CaptureFixture[str]
) -> None:
    src, key = portable

    def edit(field: str, value: object):
        def change(metadata: dict[str, str]) -> None:
            prov = json.loads(metadata["histoserve.provenance"])
            metadata["histoserve.provenance"] = json.dumps(
                [prov] if field == "*" else {**prov, field: value}
            )

        return change

    rewrite_metadata(src, tmp_path, edit("*", None), "a-list.pt2")  # sorted first
    rewrite_metadata(src, tmp_path, edit("min_batch", "one"), "b-one.pt2")
    shutil.copy2(src, tmp_path / f"{key.name}.pt2")
    argv = ["--spec", "h0-mini", "--demo", "--cpu_target", "x86-64-v3", "--max_batch", "8"]
    assert export_main([*argv, "--package_set", str(tmp_path), "--if_missing"]) == 0
    out = capsys.readouterr()
    assert f"{key.name}.pt2 fits this host (by the server's rule): nothing to export" in out.out
    assert "Traceback" not in out.err
