"""Which package of a package set to serve: the one whose build fits this host and its flags.

A model directory may hold several ``.pt2`` packages of one model, one per
build (``histoserve export --package_set``, named by their
:class:`~predictor.packages.build_key.BuildKey`). With no ``--checkpoint``, start-up
reads each one's metadata (from the zip: nothing loaded, milliseconds) and
keeps those that fit:

- this host can run it (:func:`~predictor.packages.host.check_host_compat`: device
  kind, platform, CPU instruction sets, GPU compute capability, torch release
  and, for CUDA, the CUDA version);
- its batch range holds the most items the server puts in one of its forwards
  (:data:`ServedBatch`: ``--max_batch_size`` as the model's family resolves it).

Each candidate's build key is derived from what the package says of itself
(:func:`~predictor.packages.build_key.key_from_metadata`); a recorded key that
contradicts it, or metadata not of its type, is that candidate's named
mismatch (the others are still judged). Fitting packages must be of one model
(spec, weights, dtype: what decides the features); two models fitting is an
error naming them, never a silent pick; two fitting packages of one build key
must be the same bytes (one hash each, only then), else the error names both.
Among one model's fitting builds the tie-break is: a ``-march=native`` CPU
build over the portable ``x86-64-v3`` one (it was compiled for this host's
instruction sets or a subset), then the newest export (``created_utc``),
then the file name. None fitting is an error naming each candidate's
mismatch, the build key that would fit and the command that makes it. One
package is taken as it always was, and so is ``--checkpoint``'s file: the
host checks at load refuse them when they do not fit, and a recorded key that
contradicts the package stops start-up naming the field.

The choice keeps the other fitting packages of the model, best first
(:attr:`PackageChoice.fallbacks`): start-up serves the next one when the
chosen one fails its load probe (:mod:`predictor.startup`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.errors import CheckpointError, IncompatiblePackage, StartupError
from predictor.packages.build_key import (
    BuildKey,
    check_build_facts,
    contradictions,
    gpu_target,
    key_from_metadata,
    native_target,
    torch_release,
)
from predictor.packages.digest import sha256_file
from predictor.packages.facts import check_batch_size
from predictor.packages.host import HostFacts, check_host_compat, isa_flags
from predictor.packages.metadata import provenance, read_metadata

if TYPE_CHECKING:
    import torch

ServedBatch = Callable[[Mapping[str, str]], int]
"""The most items the server puts in one forward of a package with this metadata: its
model's ``--max_batch_size`` as the model's family resolves it (a slide head's one slide),
never the raw flag; start-up derives it (:func:`predictor.startup.served_batching`)."""


@dataclass(frozen=True)
class Candidate:
    """One ``*.pt2`` of the model directory, judged against this host.

    Attributes:
        path: The file.
        key: Its build key (``None``: unreadable, or not exported by histoserve).
        created_utc: Its export time as recorded (ISO 8601), or ``""``.
        mismatch: Why it does not fit; ``""`` when it fits.
        metadata: Its metadata (``None`` when unreadable).
    """

    path: Path
    key: BuildKey | None
    created_utc: str
    mismatch: str
    metadata: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return not self.mismatch

    @property
    def native(self) -> bool:
        """Built ``-march=native`` (preferred over the portable ``x86-64-v3``)."""
        return self.key is not None and "native-" in self.key.target


@dataclass(frozen=True)
class PackageChoice:
    """The package start-up serves, and why.

    Attributes:
        path: The chosen ``.pt2``.
        key: Its build key (``None`` for packages histoserve did not export).
        reason: One line: how it was chosen.
        rejected: ``(file name, why not)`` for every other ``*.pt2`` there.
        metadata: The chosen package's metadata as read for the choice (start-up
            reads it once), or ``None`` when it could not be read.
        fallbacks: The other fitting packages of the same model, best first:
            what start-up serves instead when the chosen one fails its load probe.
    """

    path: Path
    key: BuildKey | None
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()
    metadata: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    fallbacks: tuple[Candidate, ...] = field(default=(), repr=False, compare=False)

    def fall_back(self, why: str) -> PackageChoice:
        """The next fitting package, this one's failure ``why`` among the rejected.

        Raises:
            IndexError: No fitting package is left.
        """
        nxt, *rest = self.fallbacks
        rejected = [r for r in self.rejected if r[0] != nxt.path.name]
        rejected.append((self.path.name, f"failed its load probe: {why}"))
        reason = f"{self.path.name} failed its load probe; the next fitting package of its model"
        return PackageChoice(
            nxt.path, nxt.key, reason, tuple(sorted(rejected)), nxt.metadata, tuple(rest)
        )

    def as_dict(self) -> dict[str, Any]:
        """The choice as ``GET /v2/models/{name}/config`` serves it (``package_choice``)."""
        return {
            "chosen": self.path.name,
            "reason": self.reason,
            "build_key": self.key.as_dict() if self.key else None,
            "rejected": [{"file": name, "mismatch": why} for name, why in self.rejected],
        }

    def log_line(self) -> str:
        """One log line: which package, why, and why not each other one."""
        key = self.key.name if self.key else "no build key"
        others = "; ".join(f"{name}: {why}" for name, why in self.rejected)
        return f"serving {self.path.name} ({key}): {self.reason}" + (
            f"; not taken: {others}" if others else ""
        )


def judge(
    path: Path,
    device: torch.device,
    host: HostFacts,
    *,
    served_batch: ServedBatch | None = None,
) -> Candidate:
    """Reads one package's metadata and says whether it fits (see the module docstring).

    Never raises for the package's sake: metadata that cannot be read or is
    not of its type is ``unreadable: FILE: why``, a recorded key that
    contradicts the package is ``lies about its build: ...``.
    """
    try:
        metadata = read_metadata(path)
        key = key_from_metadata(metadata)
        lies = contradictions(metadata)
        created = str(provenance(metadata).get("created_utc", ""))
    except StartupError as exc:
        return Candidate(path, None, "", f"unreadable: {path}: {_why(exc, path)}")
    if lies:
        return Candidate(path, key, created, f"lies about its build: {'; '.join(lies)}", metadata)
    mismatch = _mismatch(metadata, device, host, served_batch)
    return Candidate(path, key, created, mismatch, metadata)


def _why(exc: Exception, path: Path) -> str:
    """The error's message without its leading ``checkpoint PATH`` (the caller names the file)."""
    text = str(exc)
    for prefix in (f"checkpoint {path}: ", f"checkpoint {path} is ", f"checkpoint {path} "):
        if text.startswith(prefix):
            return text.removeprefix(prefix)
    return text


def _mismatch(
    metadata: Mapping[str, str],
    device: torch.device,
    host: HostFacts,
    served_batch: ServedBatch | None,
) -> str:
    try:
        check_host_compat(metadata, device, host)
        if served_batch is not None:
            check_batch_size(metadata, served_batch(metadata))
    except StartupError as exc:
        return str(exc)
    return ""


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Fitting candidates best first: native CPU build, then newest export, then name."""
    fitting = [c for c in candidates if c.fits]
    fitting.sort(key=lambda c: c.path.name)
    fitting.sort(key=lambda c: (c.native, c.created_utc), reverse=True)
    return fitting


def choose_package(
    model_dir: Path,
    candidates: Sequence[Path],
    device: torch.device,
    host: HostFacts | None = None,
    *,
    served_batch: ServedBatch | None = None,
) -> PackageChoice:
    """The package to serve from ``candidates`` (every ``*.pt2`` of ``model_dir``).

    One candidate is taken as it always was: its own checks at load say what
    is wrong with it. Several are a package set, judged by the rule of the
    module docstring.

    Args:
        model_dir: The model directory (for messages).
        candidates: Its ``*.pt2`` files.
        device: The device the server runs on.
        host: This host's facts; detected when ``None`` (tests pass fakes).
        served_batch: The most items a forward of each candidate holds
            (:data:`ServedBatch`): its batch range must hold it; None: not checked.

    Raises:
        IncompatiblePackage: None fits: names each candidate and its mismatch,
            the build key that would fit and the command that makes it.
        CheckpointError: Packages of different models fit (spec, weights or
            dtype differ): names them; choose one with ``--checkpoint``.
    """
    if len(candidates) == 1:
        return taken(candidates[0], f"the only *.pt2 in {model_dir}")
    host = host or HostFacts.detect()
    judged = [judge(p, device, host, served_batch=served_batch) for p in candidates]
    fitting = rank(judged)
    if not fitting:
        raise IncompatiblePackage(_none_fits(model_dir, judged, device, host))
    best = fitting[0]
    models = {c.key.model if c.key else ("?", c.path.name, "?") for c in fitting}
    if len(models) > 1:
        names = ", ".join(f"{c.path.name} ({_model_line(c.key)})" for c in fitting)
        raise CheckpointError(
            f"packages of different models fit this host in {model_dir}: {names}; "
            f"a package set holds one model (spec, weights, dtype): choose with --checkpoint"
        )
    check_same_bytes(fitting)
    rejected = [(c.path.name, c.mismatch) for c in judged if not c.fits]
    rejected += [(c.path.name, f"fits, ranked below {best.path.name}") for c in fitting[1:]]
    reason = (
        f"fits this host ({_host_line(device, host)}); {len(fitting)} of {len(judged)} fit, "
        "preferred: native CPU build, then newest export, then name"
    )
    return PackageChoice(
        best.path, best.key, reason, tuple(sorted(rejected)), best.metadata, tuple(fitting[1:])
    )


def check_same_bytes(candidates: Sequence[Candidate]) -> None:
    """Two packages of one build key must be one package: the same bytes.

    Hashes only the candidates that share a key with another (a set holds one
    file per key, so usually none). A package that copied another's key,
    provenance and all, is found here.

    Raises:
        CheckpointError: Two packages of one key differ; names both and their digests.
    """
    by_key: dict[BuildKey, list[Candidate]] = {}
    for candidate in candidates:
        if candidate.key is not None:
            by_key.setdefault(candidate.key, []).append(candidate)
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        digests = {}
        for candidate in group:
            try:
                digests[candidate.path] = sha256_file(candidate.path)
            except OSError as exc:
                raise CheckpointError(f"cannot read checkpoint {candidate.path}: {exc}") from exc
        first = group[0].path
        for other in group[1:]:
            if digests[other.path] != digests[first]:
                raise CheckpointError(
                    f"packages {first} (sha256 {digests[first]}) and {other.path} (sha256 "
                    f"{digests[other.path]}) say they are the same build {key.name} but differ "
                    f"in bytes: one of them is not what it says. What to do: remove the one you "
                    f"did not export (or both, and export again with `histoserve export "
                    f"--package_set`)"
                )


def taken(path: Path, reason: str) -> PackageChoice:
    """``path`` as the choice, unjudged (``--checkpoint``'s file, or the only package).

    Its key is read when it can be; when not, :func:`~predictor.packages.facts.inspect_package`
    reads the metadata again and says what is wrong.

    Raises:
        CheckpointError: Its recorded build key contradicts what it says of itself.
    """
    try:
        metadata = read_metadata(path)
        key = key_from_metadata(metadata)
    except StartupError:
        return PackageChoice(path, None, reason)
    check_build_facts(metadata, f"package {path}")
    return PackageChoice(path, key, reason, metadata=metadata)


def _model_line(key: BuildKey | None) -> str:
    return "no build key" if key is None else f"{key.spec}, {key.weights}, {key.dtype}"


def _host_line(device: torch.device, host: HostFacts) -> str:
    if device.type == "cuda":
        index = device.index or 0
        arch = host.cuda_capabilities[index] if index < len(host.cuda_capabilities) else "?"
        return f"{device}, sm_{arch}, torch {host.torch_version}, CUDA {host.cuda_version}"
    return f"cpu {host.machine}, torch {host.torch_version}"


def wanted_key(template: BuildKey, device: torch.device, host: HostFacts) -> BuildKey:
    """``template``'s model built for this host: what a package that fits would be named."""
    target = native_target(isa_flags(host.cpu_flags))
    if device.type == "cuda":
        index = device.index or 0
        arch = host.cuda_capabilities[index] if index < len(host.cuda_capabilities) else "?"
        target = gpu_target(arch, target)
        return template.for_host(torch_release(host.torch_version), host.cuda_version, target)
    return template.for_host(torch_release(host.torch_version), None, target)


def export_command(key: BuildKey, source: str, model_dir: Path, device: torch.device) -> str:
    """The ``histoserve export`` command that builds ``key`` into ``model_dir``."""
    kind, _, rest = source.partition(":")
    weights = f"<weights file with sha256 {key.weights_sha256}>" if key.weights_sha256 else ""
    if kind == "demo":
        flags = ["--demo", "--demo_preset", rest or "tiny"]
    elif kind == "timm":
        flags = ["--timm", rest, "--weights", weights or "<weights file>"]
    else:
        flags = [
            "--module",
            rest or "<pkg.mod:factory>",
            *(["--weights", weights] if weights else []),
        ]
    argv = [
        "histoserve", "export", "--spec", key.spec, *flags, "--dtype", key.dtype,
        "--min_batch", str(key.min_batch), "--max_batch", str(key.max_batch),
        "--device", device.type, "--package_set", str(model_dir),
    ]  # fmt: skip
    return shlex.join(argv)


def _none_fits(
    model_dir: Path, judged: Sequence[Candidate], device: torch.device, host: HostFacts
) -> str:
    lines = "; ".join(f"{c.path.name}: {c.mismatch}" for c in judged)
    text = f"no package in {model_dir} fits this host ({_host_line(device, host)}): {lines}"
    template = next((c for c in judged if c.key is not None), None)
    if template is None or template.key is None:
        return text + "; export one for this host with histoserve export --package_set"
    return text + missing_hint(template.key, template.metadata or {}, model_dir, device, host)


def missing_hint(
    key: BuildKey,
    metadata: Mapping[str, str],
    model_dir: Path,
    device: torch.device,
    host: HostFacts | None = None,
) -> str:
    """``; missing build key K; make it ... with: <command>``: what a refused package's model
    would need on this host, for the end of a start-up error."""
    host = host or HostFacts.detect()
    missing = wanted_key(key, device, host)
    source = str(provenance(metadata).get("source", "module:"))
    return (
        f"; missing build key {missing.name}; make it on this kind of host with: "
        f"{export_command(missing, source, model_dir, device)} "
        f"(or let the chart's model.build do it)"
    )


def config_facts(package: Any) -> dict[str, Any]:
    """What ``GET /v2/models/{name}/config`` says of the served package's build.

    ``build_key`` (its :class:`BuildKey` fields and ``name``, or ``None``),
    ``weights_sha256`` (the weights file it was exported from, or ``None``):
    both derived from the package's own facts, so they never disagree,
    and ``package_choice`` (how start-up chose it, ``{}`` when unknown), so a
    cohort can show that two node pools served features from the same weights.

    Args:
        package: A :class:`~predictor.runtime.loader.LoadedPackage`, or ``None``.
    """
    if package is None:
        return {"build_key": None, "weights_sha256": None, "package_choice": {}}
    key = key_from_metadata(package.metadata)
    return {
        "build_key": key.as_dict() if key else None,
        "weights_sha256": key.weights_sha256 if key else None,
        "package_choice": dict(package.choice),
    }
