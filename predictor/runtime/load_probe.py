"""Load a package once in a child process before trusting it in this one (``--load_probe``).

A ``.pt2`` holds a shared library: loading it runs native code (its
constructors, the constants upload to the device, the first kernels). When
that code crashes, the process that loaded it dies by a signal with nothing
said: a server that took it would exit 139 after its first log line, a pod
in CrashLoopBackOff with a blank log. :func:`probe_load` loads the package in
a fresh ``python -m predictor.runtime.load_child`` first, in its own process
group, with a deadline (``time.monotonic()``), and reads the child's flushed
per-step markers from a pipe; the child's stderr (``faulthandler``'s stack on
a fatal signal, or every thread's stack just before the deadline) goes to a
temporary file the parent logs on failure. A signal, a non-zero exit or a
load past the deadline (the whole group is then killed) is a
:class:`~predictor.errors.CheckpointError` naming the package file, its build
(torch, CUDA, GPU architecture or CPU target, dtype, from its metadata), the
signal or the timeout, the last step reached, and what to do.

The server runs it under ``--load_probe`` (``auto``: CUDA packages, whose
loads were seen to crash, and any package this host has not loaded before;
see :func:`probe_wanted`); the exporter runs it on
every package it writes, with a batch to compare against the eager module
(:mod:`predictor.export.verify`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from predictor.errors import CheckpointError
from predictor.packages.metadata import CPU_BUILD_KEY, provenance, read_field
from predictor.packages.weights_layout import EMBEDDED, FLAG, MAPPED, library_layout

logger = logging.getLogger("histoserve")

CHILD_MODULE = "predictor.runtime.load_child"
SERVER_OFF_HINT = (
    "--load_probe off skips this check, and the same crash then kills the server itself"
)
_TAIL_BYTES = 6000
_DUMP_MARGIN = 0.9  # the child dumps its threads' stacks at this share of the deadline


def probe_wanted(setting: str, metadata: Mapping[str, str], *, loaded_before: bool) -> bool:
    """Whether start-up probes the package: ``on``, ``off``, or ``auto`` (the default).

    ``auto`` probes every CUDA package (their loads were seen to crash on one
    node and not another) and every CPU package this host has not loaded
    before (``loaded_before``: :mod:`predictor.packages.probe_record`), so a
    library that hangs, crashes or exits in its load is exit 2 with a
    message at the defaults too, while the common restart pays nothing.
    """
    if setting == "auto":
        return metadata.get("AOTI_DEVICE_KEY") == "cuda" or not loaded_before
    return setting == "on"


@dataclass(frozen=True)
class ProbeReport:
    """A probe that passed: how long it took and when each step began (seconds from the start)."""

    seconds: float
    steps: tuple[tuple[str, float], ...]

    def summary(self) -> str:
        """``import_torch 0.00s, read_metadata 2.10s, ...``: one log line."""
        return ", ".join(f"{name} {at:.2f}s" for name, at in self.steps)


@dataclass
class _Outcome:
    """What the child left: its markers, return code, whether it timed out, its output tail."""

    lines: list[str]
    returncode: int | None
    timed_out: bool
    tail: str
    seconds: float


def describe_build(metadata: Mapping[str, str]) -> str:
    """The package's build in one phrase: device, torch, CUDA and architecture or CPU target, dtype."""
    prov = provenance(metadata)
    kind = metadata.get("AOTI_DEVICE_KEY") or prov.get("device") or "unknown device"
    parts = [f"{kind} package", f"torch {prov.get('torch_version') or 'unknown'}"]
    if kind == "cuda":
        parts.append(f"CUDA {prov.get('cuda_version') or 'unknown'}")
        arch = metadata.get("AOTI_COMPUTE_CAPABILITY")
        parts.append(f"sm_{arch}" if arch else "GPU architecture unrecorded")
    else:
        march = read_field(metadata, CPU_BUILD_KEY).get("march") or prov.get("cpu_target")
        isa = metadata.get("AOTI_CPU_ISA") or "no vector ISA recorded"
        parts.append(f"-march={march or 'unknown'} ({isa})")
    if prov.get("dtype"):
        parts.append(str(prov["dtype"]))
    if prov.get("weights_layout") == MAPPED:
        parts.append("weights mapped")
    if prov.get("source"):
        parts.append(f"from {prov['source']}")
    return ", ".join(parts)


def child_command(
    path: Path,
    device: str,
    runner: str,
    marker_fd: int,
    timeout_s: float,
    exchange: tuple[Path, Path] | None = None,
) -> list[str]:
    """The child's command line (``python -m predictor.runtime.load_child ...``)."""
    argv = [sys.executable, "-X", "faulthandler", "-m", CHILD_MODULE]
    argv += [str(path), device, runner, str(marker_fd)]
    argv += ["--dump_after_s", f"{timeout_s * _DUMP_MARGIN:.3f}"]
    if exchange is not None:
        argv += ["--inputs", str(exchange[0]), "--outputs", str(exchange[1])]
    return argv


def probe_load(
    path: Path,
    device: str,
    metadata: Mapping[str, str],
    *,
    runner: str = "auto",
    timeout_s: float,
    exchange: tuple[Path, Path] | None = None,
    what: str = "load probe",
    timeout_flag: str = "--load_timeout_s",
    off_hint: str | None = SERVER_OFF_HINT,
) -> ProbeReport:
    """Loads ``path`` on ``device`` in a fresh child and runs one batch there; raises if it fails.

    Args:
        path: The ``.pt2`` file.
        device: ``cpu`` or ``cuda:N``, as the server will load it.
        metadata: The package's metadata (read from the zip), for the message.
        runner: ``--forward_runner`` (``auto``, ``torch`` or ``gil_free``).
        timeout_s: The child's deadline, ``import torch`` included.
        exchange: ``(inputs file, outputs file)``: run these inputs and write
            the outputs (the exporter's comparison); zeros when None.
        what: How the message names this check.
        timeout_flag: The flag that sets ``timeout_s``, for the message.
        off_hint: What turning the check off means, for the message (None: nothing).

    Returns:
        The time taken and each step's start.

    Raises:
        CheckpointError: The child died by a signal, exited non-zero or ran
            past ``timeout_s``; the message says which, the package, its
            build, the last step reached and what to do.
    """
    outcome = _run_child(Path(path), device, runner, timeout_s, exchange)
    steps = _steps(outcome.lines)
    if not outcome.timed_out and outcome.returncode == 0 and "done" in outcome.lines:
        return ProbeReport(seconds=outcome.seconds, steps=steps)
    if outcome.tail.strip():
        logger.error("%s of %s: the child's output ends with:\n%s", what, path, outcome.tail)
    context = _Context(what, timeout_flag, timeout_s, off_hint)
    raise CheckpointError(_failure_message(Path(path), metadata, outcome, steps, context))


def _run_child(
    path: Path, device: str, runner: str, timeout_s: float, exchange: tuple[Path, Path] | None
) -> _Outcome:
    """Starts the child in its own process group and waits for it until ``timeout_s``."""
    started = time.monotonic()
    deadline = started + timeout_s
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, PYTHONPATH=_import_path())
    with tempfile.TemporaryFile() as output:
        try:
            proc = subprocess.Popen(
                child_command(path, device, runner, write_fd, timeout_s, exchange),
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                pass_fds=(write_fd,), start_new_session=True, env=env,
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        try:
            data, finished = _read_until(read_fd, deadline, proc)
            timed_out = not finished or not _wait(proc, deadline)
        finally:
            os.close(read_fd)
            if proc.poll() is None:
                _kill_group(proc)
        output.seek(0, os.SEEK_END)
        output.seek(max(0, output.tell() - _TAIL_BYTES))
        tail = output.read().decode("utf-8", "replace")
    return _Outcome(
        lines=data.decode("utf-8", "replace").splitlines(),
        returncode=proc.returncode,
        timed_out=timed_out,
        tail=tail,
        seconds=time.monotonic() - started,
    )


def _import_path() -> str:
    """``PYTHONPATH`` for the child: this ``predictor``'s folder first, then the caller's."""
    import predictor

    here = str(Path(predictor.__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH")
    return f"{here}{os.pathsep}{rest}" if rest else here


def _read_until(fd: int, deadline: float, proc: subprocess.Popen[bytes]) -> tuple[bytes, bool]:
    """Everything written on the pipe until the child is gone (True) or the deadline (False).

    The pipe's end is the usual sign; the child's exit is the other (a
    helper process it forked may still hold the pipe open).
    """
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            exited = proc.poll() is not None
            if not selector.select(0 if exited else min(left, 0.5)):
                if exited:
                    return data, True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return data, True
            data += chunk
    return data, False


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Waits for the child (``waitpid``) until the deadline; False when it is still running."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the child's whole process group (compilers it started included), then reaps it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _steps(lines: list[str]) -> tuple[tuple[str, float], ...]:
    marks = [line.split() for line in lines if line.startswith("step ")]
    if not marks:
        return ()
    first = float(marks[0][2])
    return tuple((m[1], float(m[2]) - first) for m in marks if len(m) == 3)


@dataclass(frozen=True)
class _Context:
    """Who probes, for the message: the check's name, its timeout flag and value, the off hint."""

    what: str
    timeout_flag: str
    timeout_s: float
    off_hint: str | None


def _failure_message(
    path: Path,
    metadata: Mapping[str, str],
    outcome: _Outcome,
    steps: tuple[tuple[str, float], ...],
    context: _Context,
) -> str:
    last = steps[-1][0] if steps else "process start (before the first step)"
    error = next((line[6:] for line in outcome.lines if line.startswith("error ")), None)
    gpu = " and GPU type" if metadata.get("AOTI_DEVICE_KEY") == "cuda" else ""
    if outcome.timed_out:
        how = f"did not finish within {context.timeout_flag} {context.timeout_s:g} s (killed)"
        todo = (
            f"if the node is only slow (a cold disk, a large package, a busy CPU), raise "
            f"{context.timeout_flag} (and the pod's startup probe budget with it); otherwise the "
            f"Python stack the child printed just before the deadline (logged above) shows where "
            f"it hung"
        )
    elif outcome.returncode is not None and outcome.returncode < 0:
        how = f"was killed by signal {_signal_name(-outcome.returncode)}"
        todo = (
            f"re-export the package with `histoserve export` on a node with this torch{gpu} "
            f"(a package built elsewhere, or from an inductor cache a killed export left, can "
            f"crash on load){_layout_hint(path, metadata, last)}; the native crash's Python stack is "
            f"logged above"
        )
    elif outcome.returncode == 0:
        how = "exited with status 0 before it finished (the library ended the process)"
        todo = (
            f"re-export the package with `histoserve export` on this torch{gpu}; a library "
            f"that exits while loading would take the server down with it"
        )
    else:
        how = f"failed (exit {outcome.returncode}): {error or 'no message'}"
        todo = f"fix the cause above, or re-export the package with `histoserve export` on this torch{gpu}"
    if context.off_hint and (outcome.timed_out or (outcome.returncode or 0) <= 0):
        todo = f"{todo}; {context.off_hint}"
    return (
        f"{context.what}: loading package {path} ({describe_build(metadata)}) in a fresh process "
        f"{how} during step '{last}', after {outcome.seconds:.1f} s. What to do: {todo}."
    )


def _layout_hint(path: Path, metadata: Mapping[str, str], last_step: str) -> str:
    """For a CUDA package with embedded weights (read from its library: packages built
    before the layout was recorded have none) that crashed while loading: the other layout."""
    if metadata.get("AOTI_DEVICE_KEY") != "cuda" or last_step != "load":
        return ""
    try:
        if library_layout(path) != EMBEDDED:
            return ""
    except CheckpointError:
        return ""
    return (
        "; a crash while loading can be the weights' upload from the library's data section: "
        f"export with `{FLAG} {MAPPED}` to map them from the file instead"
    )


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return str(number)
    description = signal.strsignal(number)
    return f"{name} ({description})" if description else name
