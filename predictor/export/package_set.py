"""``histoserve export --package_set DIR``: one package per build key, exported once.

The package goes to ``DIR/<build key>.pt2`` (+ ``.sha256``;
:class:`~predictor.packages.build_key.BuildKey`), through the exporter's own
stage-then-rename (:func:`predictor.export.build.export_package`), so a
killed or failed export leaves no ``.pt2`` a server could take (at most a
``.export-*`` staging folder, which no server reads and the next export
removes once its owner is dead). Around it:

- an exclusive ``flock`` per key, ``DIR/.locks/<key>.lock`` (opened with
  ``O_NOFOLLOW``, never truncated; the kernel drops it when its holder dies):
  concurrent exporters of one key (pods starting together on one volume)
  export it once; the others wait, bounded by ``--lock_timeout_s``, then take
  the result;
- a fresh inductor cache per export, as every export gets one
  (:func:`predictor.export.scratch.fresh_inductor_cache`): nothing an
  earlier, killed export left in a cache is packaged;
- ``--if_missing``: when a package of the same model (spec, weights, dtype)
  already fits this host by the server's own rule
  (:mod:`predictor.packages.package_set`) and matches its ``.sha256``, nothing is
  exported: what a pod's init container runs before every start. A package
  that fails its digest (left by an exporter killed between its two renames
  before :mod:`predictor.export.commit` fixed their order, or edited) is not
  taken; its key is exported again over it, so no such state jams a pod.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from predictor.errors import CheckpointError, SpecError, StartupError
from predictor.export.sources import weights_digest
from predictor.packages.build_key import (
    BuildKey,
    contradictions,
    cpu_target_name,
    gpu_target,
    key_from_metadata,
    torch_release,
)
from predictor.packages.build_key import weights_id as make_weights_id
from predictor.packages.digest import verify_sha256
from predictor.packages.host import HostFacts, isa_flags, read_cpu_flags
from predictor.packages.metadata import read_metadata
from predictor.packages.package_set import judge, rank
from predictor.packages.weights_layout import AUTO, FLAG, MAPPED, library_layout

logger = logging.getLogger("histoserve")

LOCK_FOLDER = ".locks"
LOCK_POLL_S = 0.2


class LockTimeout(CheckpointError):
    """Another exporter held the key's lock longer than the bound."""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--output FILE`` or ``--package_set DIR``, with ``--if_missing`` and ``--lock_timeout_s``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", type=Path, help="the .pt2 file to write")
    where.add_argument(
        "--package_set",
        type=Path,
        metavar="DIR",
        help="write DIR/<build key>.pt2: one package per build, each key exported once",
    )
    parser.add_argument(
        "--if_missing",
        action="store_true",
        help="with --package_set: export only when no package of this model fits this host",
    )
    parser.add_argument(
        "--lock_timeout_s",
        type=float,
        default=3600.0,
        help="with --package_set: longest wait for another exporter of the same build key",
    )


def run(
    args: argparse.Namespace,
    spec_name: str,
    opts: Mapping[str, Any],
    export: Callable[[Path], Path],
) -> Path:
    """``histoserve export --package_set DIR``: the key first, then export unless it is there.

    Args:
        args: The parsed export command (its source, ``--weights``,
            ``--package_set``, ``--if_missing``, ``--lock_timeout_s``).
        spec_name: The spec's name.
        opts: The export options (``device``, ``dtype``, batch range, ``cpu_target``,
            ``weights_layout``: with ``mmap``, a package of the key with embedded
            weights neither fits nor is taken, and is replaced).
        export: Writes the package to the path it is given.
    """
    if args.package_set is None:
        if args.if_missing:
            raise SpecError("--if_missing goes with --package_set")
        return export(args.output)
    if args.demo:
        source = f"demo:{args.demo_preset}"
    else:
        source = f"timm:{args.timm}" if args.timm else f"module:{args.module}"
    key = export_key(
        spec_name=spec_name,
        source=source,
        weights_sha256=weights_digest(args.weights) if args.weights else None,
        dtype=opts["dtype"],
        min_batch=opts["min_batch"],
        max_batch=opts["max_batch"],
        device=opts["device"],
        cpu_target=opts["cpu_target"],
    )
    layout = opts.get("weights_layout", AUTO)
    if args.if_missing:
        found = fitting_package(args.package_set, key, weights_layout=layout)
        if found is not None:
            print(f"{found.name} fits this host (by the server's rule): nothing to export")
            return found
    path, exported = export_into_set(
        args.package_set, key, export, lock_timeout_s=args.lock_timeout_s, weights_layout=layout
    )
    print(f"{path.name}: " + ("exported" if exported else "exported by another exporter; taken"))
    return path


def export_key(
    *,
    spec_name: str,
    source: str,
    weights_sha256: str | None,
    dtype: str,
    min_batch: int,
    max_batch: int,
    device: str,
    cpu_target: str,
) -> BuildKey:
    """The build key of an export with these options on this host (torch, CUDA, GPU, CPU).

    :func:`predictor.export.build.export_package` records the same key in
    the package's metadata.

    Raises:
        SpecError: A CUDA device asked for on a host without one.
    """
    target_device = torch.device(device)
    target, cuda = cpu_target_name(cpu_target, isa_flags(read_cpu_flags())), None
    if target_device.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError(f"--device {device} but this host has no usable CUDA GPU")
        major, minor = torch.cuda.get_device_capability(target_device)
        target, cuda = gpu_target(f"{major}{minor}", target), torch.version.cuda
    return BuildKey(
        spec=spec_name,
        weights=make_weights_id(source, weights_sha256),
        dtype=dtype,
        min_batch=min_batch,
        max_batch=max_batch,
        torch=torch_release(torch.__version__),
        cuda=cuda,
        target=target,
    )


def package_path(folder: Path, key: BuildKey) -> Path:
    """Where ``key``'s package lives in a package set."""
    return Path(folder) / f"{key.name}.pt2"


def fitting_package(folder: Path, key: BuildKey, *, weights_layout: str = AUTO) -> Path | None:
    """A package in ``folder`` of ``key``'s model that the server would take on this host.

    The server's own rule (:func:`predictor.packages.package_set.judge`, best
    first by :func:`~predictor.packages.package_set.rank`) on ``key``'s device,
    for a batch range reaching ``key.max_batch``; with ``weights_layout``
    ``mmap``, only a package whose weights are mapped.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    device = torch.device("cuda" if key.target.startswith("sm_") else "cpu")
    host = HostFacts.detect()
    # a package at least as wide as asked (a package fact, the export's --max_batch, not a
    # serving bound): the server's --max_batch_size may need it all
    judged = [
        judge(p, device, host, served_batch=lambda _: key.max_batch)
        for p in sorted(folder.glob("*.pt2"))
        if p.is_file()
    ]
    same = [c for c in rank(judged) if c.key is not None and c.key.model == key.model]
    same = [c for c in same if _layout_fits(c.path, weights_layout)]
    return next((c.path for c in same if _digest_holds(c.path)), None)


def _digest_holds(path: Path) -> bool:
    """The package matches its ``.sha256`` (or has none); logs why not."""
    try:
        verify_sha256(path)
    except CheckpointError as exc:
        logger.warning("package set: %s is not taken: %s", path.name, exc)
        return False
    return True


def _layout_fits(path: Path, weights_layout: str) -> bool:
    """``auto`` takes either layout; ``mmap`` only a library with its weights mapped."""
    if weights_layout == AUTO:
        return True
    try:
        return library_layout(path) == MAPPED
    except CheckpointError:
        return False


def export_into_set(
    folder: Path,
    key: BuildKey,
    export: Callable[[Path], Path],
    *,
    lock_timeout_s: float,
    weights_layout: str = AUTO,
) -> tuple[Path, bool]:
    """``key``'s package in ``folder``: exported here, or taken from the exporter that holds the lock.

    Args:
        folder: The package set (created when missing).
        key: The build key; the package is ``folder/<key.name>.pt2``.
        export: Writes the package to the path it is given (stage then rename).
        lock_timeout_s: Longest wait for another exporter of this key.
        weights_layout: ``mmap``: a package of the key there already is taken only
            when its weights are mapped, else exported again (replaced).

    Returns:
        ``(path, exported)``: ``exported`` is False when it was already there.

    Raises:
        LockTimeout: Another exporter held the lock past ``lock_timeout_s``.
        CheckpointError: The folder is not writable, or the package written
            records another build key than ``key``.
    """
    folder = Path(folder)
    target = package_path(folder, key)
    with _key_lock(folder, key, lock_timeout_s):
        if _holds(target, key):
            if _layout_fits(target, weights_layout):
                logger.info("package set: %s is there already; taking it", target.name)
                return target, False
            logger.info(
                "package set: %s has its weights embedded; exporting it again with %s %s",
                target.name, FLAG, weights_layout,
            )  # fmt: skip
        start = time.monotonic()
        export(target)
        if not _holds(target, key):
            raise CheckpointError(
                f"exported {target} but its metadata records another build key than "
                f"{key.name}; the exporter and the package set disagree (a bug)"
            )
        logger.info("package set: exported %s in %.1f s", target.name, time.monotonic() - start)
        return target, True


def _holds(path: Path, key: BuildKey) -> bool:
    """``path`` is ``key``'s package: its derived key, no contradicting claim, its digest."""
    if not path.is_file():
        return False
    try:
        metadata = read_metadata(path)
        if key_from_metadata(metadata) != key or contradictions(metadata):
            return False
    except StartupError:
        return False
    return _digest_holds(path)


@contextlib.contextmanager
def _key_lock(folder: Path, key: BuildKey, timeout_s: float) -> Iterator[Path]:
    locks = folder / LOCK_FOLDER
    try:
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            locks / f"{key.name}.lock",
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
    except OSError as exc:
        raise CheckpointError(
            f"cannot lock build key {key.name} in package set {folder} ({exc}); "
            f"the package set must be writable to export into it"
        ) from exc
    try:
        _acquire(fd, key, folder, timeout_s)
        yield locks / f"{key.name}.lock"
    finally:
        os.close(fd)


def _acquire(fd: int, key: BuildKey, folder: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"another exporter has held the lock of build key {key.name} in {folder} "
                    f"for over {timeout_s:.0f} s (--lock_timeout_s); is it stuck? its pod's "
                    f"log says; raise the bound for a slow export"
                ) from None
            if not waited:
                logger.info("package set: another exporter builds %s; waiting", key.name)
                waited = True
            time.sleep(LOCK_POLL_S)
