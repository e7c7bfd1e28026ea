"""The child of the load probe: ``python -m predictor.runtime.load_child`` (see :mod:`predictor.runtime.load_probe`).

``python -m predictor.runtime.load_child PACKAGE DEVICE RUNNER MARKER_FD
[--dump_after_s S] [--inputs FILE --outputs FILE]``

Loads a ``.pt2`` package the way the server does
(:func:`predictor.runtime.loader.load_package`, one model copy) and runs one
batch through it, in a process that may die: a native crash in the
package's shared library (its constructors, the constants upload, the first
forward) kills this process, not the server or the exporter that started it.
Before each step it writes ``step NAME MONOTONIC`` on ``MARKER_FD`` (a pipe
the parent reads; ``os.write``, unbuffered), so the parent knows the last step
reached whatever happens after; the end is ``done``, a Python error
``error MESSAGE`` and exit 3. ``faulthandler`` prints the Python stack of a
fatal signal to stderr, and of every thread after ``--dump_after_s`` (just
before the parent's deadline), so a hang leaves where it was.

The batch is zeros of the package's recorded inputs (``histoserve.inputs``)
at its smallest batch, or, with ``--inputs``, the tensors of that file
(``torch.save`` of a tuple, loaded with ``weights_only``); ``--outputs`` then
receives the package's outputs as they are, on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

EXIT_ERROR = 3
"""Exit status of a Python-level failure (the message is on the marker pipe)."""


class Markers:
    """Writes one flushed line per step on the parent's pipe (``step NAME MONOTONIC``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def say(self, line: str) -> None:
        data = (" ".join(line.split()) + "\n").encode("utf-8", "replace")
        with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
            os.write(self.fd, data)

    def step(self, name: str) -> None:
        self.say(f"step {name} {time.monotonic():.6f}")


def marking_phases(markers: Markers) -> object:
    """A :class:`~predictor.packages.phases.StartupPhases` whose every phase is also a step.

    When a nested phase ends, the phase around it is announced again: the
    last step reached is then always the one running.
    """
    from predictor.packages.phases import StartupPhases

    class MarkingPhases(StartupPhases):
        def __init__(self) -> None:
            super().__init__()
            self._names: list[str] = []

        @contextmanager
        def time(self, phase: str) -> Iterator[None]:
            markers.step(phase)
            self._names.append(phase)
            try:
                with super().time(phase):
                    yield
            finally:
                self._names.pop()
                if self._names:
                    markers.step(self._names[-1])

    return MarkingPhases()


def _die_with_parent() -> None:
    """``PR_SET_PDEATHSIG``: a server killed during start-up takes its probe with it."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG; best effort


def _zeros(metadata: dict[str, str], device: object) -> tuple[object, ...]:
    import torch

    from predictor.packages.dtypes import dtype_from_name
    from predictor.packages.metadata import INPUTS_KEY, provenance, read_field

    batch = max(1, int(provenance(metadata).get("min_batch", 1)))
    return tuple(
        torch.zeros((batch, *d["shape"][1:]), dtype=dtype_from_name(d["dtype"]), device=device)
        for d in read_field(metadata, INPUTS_KEY)
    )


def run(args: argparse.Namespace, markers: Markers) -> None:
    """The probe's steps, each announced before it starts."""
    markers.step("import_torch")
    import torch

    from predictor.packages.metadata import read_metadata
    from predictor.runtime.loader import load_package

    markers.step("read_metadata")
    metadata = read_metadata(args.package)
    device = torch.device(args.device)
    if device.type == "cuda":
        markers.step("cuda_init")
        torch.cuda.init()
    phases: Any = marking_phases(markers)
    with phases.time("load"):
        package = load_package(
            args.package, device, metadata=metadata, phases=phases, runner=args.runner
        )
    if args.inputs:
        markers.step("read_inputs")
        inputs = tuple(t.to(device) for t in torch.load(args.inputs, weights_only=True))
    else:
        inputs = _zeros(metadata, device)
    if not inputs:
        return  # a package that records no inputs (built elsewhere): loading was the check
    markers.step("forward")
    with torch.inference_mode():
        outputs = package(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if args.outputs:
        markers.step("write_outputs")
        torch.save(tuple(o.cpu() for o in outputs), args.outputs)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the probe; 0 when the package loaded and ran, 3 on a Python error."""
    faulthandler.enable(all_threads=True)
    _die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m predictor.runtime.load_child")
    parser.add_argument("package")
    parser.add_argument("device")
    parser.add_argument("runner")
    parser.add_argument("marker_fd", type=int)
    parser.add_argument("--dump_after_s", type=float, default=0.0)
    parser.add_argument("--inputs")
    parser.add_argument("--outputs")
    args = parser.parse_args(argv)
    os.set_inheritable(args.marker_fd, False)  # compilers and helpers it starts never hold it
    markers = Markers(args.marker_fd)
    if args.dump_after_s > 0:
        faulthandler.dump_traceback_later(args.dump_after_s)
    try:
        run(args, markers)
    except Exception as exc:
        markers.say(f"error {type(exc).__name__}: {exc}")
        print(f"load probe: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    finally:
        faulthandler.cancel_dump_traceback_later()
    markers.say("done")
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # nothing left to do: skip torch's teardown (a second of the probe's cost)
