"""Run an AOTInductor ``.pt2`` package with the GIL released for the whole forward.

Why: torch's own binding (``AOTIModelPackageLoader.run``/``boxed_run``) holds
the GIL while a CPU forward runs, so in a server the asyncio event loop (HTTP
parsing, admission, batching of the next requests) stands still for the length
of every batch. This module calls the package's AOTInductor C ABI
(``AOTInductorModelContainerRun`` in the package's shared library) through
:mod:`ctypes`, which drops the GIL for the duration of a foreign call.

Contract:
    * :class:`GilFreeRunner` ``(path, device)`` loads the package's model
      (``data/aotinductor/<model>/*.so``, weights embedded in it, as
      ``histoserve export`` writes them) and is callable on the package's
      flat tensor inputs; it returns the flat tuple of outputs, the same
      tensors (bit for bit) as ``torch._inductor.aoti_load_package``'s model.
    * Every input is checked in Python before the call
      (:mod:`predictor.runtime.input_checks`: plain CPU tensor, dtype, rank,
      each axis and the batch range, contiguity, storage size): the library
      reads raw memory and, with the package's own checks off, checks
      nothing. A refused input is a ``ValueError`` naming the input and the
      reason, never a silent wrong answer or a crash. A failed forward raises
      :class:`AotiRunError` with the library's own message
      (``AOTInductorGetLastError``).
    * Refused at load (``ValueError``): a package whose inputs cannot be
      checked (no recorded specs), and a package that needs a proxy executor
      (custom ops: a ``<stem>.json`` beside its library), which this runner
      does not provide; torch's loader serves both.
    * The extracted library's bytes are checked against the archive's
      CRC-32 before ``dlopen`` (:mod:`predictor.packages.extract`).
    * ``num_models`` copies of the model share one container: up to that many
      threads run forwards at once (Triton's instance groups); more wait.
    * CPU only: on CUDA the forward only launches kernels, so the GIL is held
      for microseconds anyway; use torch's loader there.

Inputs and other threads. The forward runs with the GIL released, so other
Python threads run meanwhile and may touch the inputs. Reading them is safe;
writing them in place is a data race (garbage out, no crash). The library is
handed its own alias of each input (own sizes and strides, own reference to
the storage), so re-pointing or reshaping the caller's tensor (``set_``,
``.data = ...``, ``transpose_``, a ``resize_`` that does not grow it) does not
reach the forward. Reallocating the memory does: a growing ``resize_`` of the
tensor or of any view of its storage, or ``untyped_storage().resize_()``,
frees the bytes the forward is reading and can crash the process. So by
default an input whose storage torch could reallocate (a resizable storage)
is copied on entry; one that cannot (``torch.from_numpy``, ``frombuffer``)
is not. A caller that owns its inputs outright passes
``private_inputs=True`` and skips the copy: the server does (its device
worker builds each batch tensor itself and no other thread ever sees it, so
nothing resizes an input during a forward today). With ``private_inputs``
an input whose storage moved during the forward is still detected after it
(:class:`AotiRunError`, outputs discarded), but the process may not live to
see it.

The handles passing tensors across the ABI come from torch's own helpers
(``torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors`` and
``alloc_tensors_by_stealing_from_void_ptrs``), the ones torch's
``cpp_wrapper`` path uses for the same ctypes call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from predictor.errors import CheckpointError
from predictor.packages.extract import extract_member, find_member
from predictor.packages.metadata import json_member
from predictor.runtime.input_checks import (
    InputSpec,
    NoInputSpecs,
    check_inputs,
    specs_from_cpp,
    specs_from_metadata,
)

__all__ = ["AotiRunError", "GilFreeRunner", "extract_member"]

_HANDLE = ctypes.c_void_p
_SO_SUFFIX = ".so"
_METADATA_SUFFIX = "_metadata.json"


def _capsule_api() -> tuple[Any, Any]:
    """``PyCapsule_GetPointer`` and ``PyCapsule_New`` (torch's handle helpers speak capsules)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.argtypes, get.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
    new = ctypes.pythonapi.PyCapsule_New
    new.argtypes, new.restype = (
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
        ctypes.py_object,
    )
    return get, new


class AotiRunError(RuntimeError):
    """A call into the package's C ABI returned a failure code."""


def _input_specs(
    archive: zipfile.ZipFile, names: list[str], stem: str, metadata: Mapping[str, str], path: Path
) -> tuple[InputSpec, ...]:
    """The package's input specs: its generated checks, else its ``histoserve.inputs``.

    Raises:
        NoInputSpecs: The package records neither (the runner cannot check inputs).
    """
    specs = None
    if f"{stem}.cpp" in names:
        specs = specs_from_cpp(archive.read(f"{stem}.cpp").decode("utf-8", "replace"))
    if specs is None:
        specs = specs_from_metadata(metadata)
    if specs is None:
        raise NoInputSpecs(
            f"{path.name}: records no input specs (no histoserve.inputs metadata, no "
            "generated input checks), so the GIL-free runner cannot check its inputs; "
            "serve it with --forward_runner torch"
        )
    return specs


def _check_unmoved(path: Path, args: Sequence[torch.Tensor], pointers: Sequence[int]) -> None:
    """Raises :class:`AotiRunError` when an input's memory moved during the forward."""
    for i, (tensor, pointer) in enumerate(zip(args, pointers, strict=True)):
        if tensor.untyped_storage().data_ptr() != pointer:
            raise AotiRunError(
                f"{path.name}: input {i}'s memory was reallocated during the forward "
                "(another thread resized it); outputs discarded"
            )


def _bind(lib: ctypes.CDLL) -> None:
    """Declares the C signatures used (every function returns an ``AOTIRuntimeError`` int)."""
    sigs = {
        "AOTInductorModelContainerCreateWithDevice": [
            ctypes.POINTER(_HANDLE),
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_char_p,
        ],
        "AOTInductorModelContainerDelete": [_HANDLE],
        "AOTInductorModelContainerGetNumInputs": [_HANDLE, ctypes.POINTER(ctypes.c_size_t)],
        "AOTInductorModelContainerGetNumOutputs": [_HANDLE, ctypes.POINTER(ctypes.c_size_t)],
        "AOTInductorModelContainerRun": [
            _HANDLE,
            ctypes.POINTER(_HANDLE),
            ctypes.c_size_t,
            ctypes.POINTER(_HANDLE),
            ctypes.c_size_t,
            _HANDLE,
            _HANDLE,
        ],
        "AOTInductorGetLastError": [ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int32


class GilFreeRunner:
    """A package's model behind its C ABI, called with the GIL released.

    Args:
        path: The ``.pt2`` package.
        device: Must be the CPU (see the module docstring).
        model_name: The model inside the package (``model`` for ``histoserve export``).
        num_models: Model copies in the container: concurrent forwards allowed.
        metadata: The package's AOTInductor metadata when the caller already
            read it (start-up does): not read from the zip again.
        extraction_timer: ``timer("extraction")`` is a context manager around
            copying the model library out of the zip (start-up passes
            :meth:`~predictor.packages.phases.StartupPhases.time`, so a cold
            start reports extraction apart from ``dlopen``).
        private_inputs: The caller guarantees no other thread touches an
            input during its forward: inputs are never copied (see the
            module docstring).

    Raises:
        ValueError: A CUDA device, ``num_models`` < 1, a package without
            exactly one model library, one that needs a proxy executor, or
            one whose inputs cannot be checked.
        zipfile.BadZipFile: The extracted library fails its CRC-32.
        AotiRunError: The library refused to create the model.
    """

    forward_runner = "gil_free"
    """The ``--forward_runner`` name (:attr:`LoadedPackage.forward_runner` reads it)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        *,
        model_name: str = "model",
        num_models: int = 1,
        metadata: Mapping[str, str] | None = None,
        extraction_timer: Callable[[str], AbstractContextManager[None]] | None = None,
        private_inputs: bool = False,
    ) -> None:
        device = torch.device(device)
        if device.type != "cpu":
            raise ValueError(f"GilFreeRunner runs CPU packages only, got device {device}")
        if num_models < 1:
            raise ValueError(f"num_models must be >= 1, got {num_models}")
        self.path = Path(path)
        self.num_models = num_models
        self.private_inputs = private_inputs
        self._idle = threading.Condition()  # close() waits until no forward is running
        self._running = 0
        self._handle: ctypes.c_void_p | None = None
        timer = extraction_timer or (lambda _phase: contextlib.nullcontext())
        tmp = Path(tempfile.mkdtemp(prefix="histoserve_aoti_"))
        try:
            self._metadata, self._specs, self._lib = self._extract_and_open(
                model_name, metadata, timer, tmp
            )
            self._capsule_get, self._capsule_new = _capsule_api()
            handle = _HANDLE()
            self._check(
                self._lib.AOTInductorModelContainerCreateWithDevice(
                    ctypes.byref(handle), num_models, b"cpu", None
                ),
                "create the model container",
            )
        finally:
            # Only now: weights too big for the library's data section (~2 GB
            # and up, e.g. a ViT-g) are appended to the .so file and read from
            # it by the container's constructor.
            shutil.rmtree(tmp, ignore_errors=True)
        self._handle = handle
        self.num_inputs = self._count("AOTInductorModelContainerGetNumInputs")
        self.num_outputs = self._count("AOTInductorModelContainerGetNumOutputs")
        if len(self._specs) != self.num_inputs:
            self.close()
            raise ValueError(
                f"{self.path.name}: the package records {len(self._specs)} input specs "
                f"but its model takes {self.num_inputs} inputs"
            )

    def _extract_and_open(
        self,
        model_name: str,
        metadata: Mapping[str, str] | None,
        timer: Callable[[str], AbstractContextManager[None]],
        tmp: Path,
    ) -> tuple[dict[str, str], tuple[InputSpec, ...], ctypes.CDLL]:
        """Reads the metadata (unless given) and the input specs, refuses what this
        runner cannot serve, and dlopens the model library (extracted into ``tmp``).

        The caller removes ``tmp`` once the model container exists: the
        library's mapping stays valid, and nothing is left behind in ``$TMPDIR``.
        """
        with zipfile.ZipFile(self.path) as archive:
            names = archive.namelist()
            so_name = find_member(names, model_name, _SO_SUFFIX, self.path)
            stem = so_name[: -len(_SO_SUFFIX)]
            if f"{stem}.json" in names:
                raise ValueError(
                    f"{self.path.name}: the model needs a proxy executor (custom ops: "
                    f"{Path(stem).name}.json beside its library), which the GIL-free runner "
                    "does not provide; serve it with --forward_runner torch"
                )
            if metadata is None:
                try:
                    meta_name = find_member(names, model_name, _METADATA_SUFFIX, self.path)
                    metadata = json_member(archive, meta_name, meta_name)
                except (ValueError, CheckpointError):
                    metadata = {}
            metadata = {str(k): str(v) for k, v in metadata.items()}
            specs = _input_specs(archive, names, stem, metadata, self.path)
            target = tmp / Path(so_name).name
            with timer("extraction"):
                extract_member(archive, archive.getinfo(so_name), target)
            lib = ctypes.CDLL(str(target), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        _bind(lib)
        return metadata, specs, lib

    def _count(self, function: str) -> int:
        value = ctypes.c_size_t()
        self._check(getattr(self._lib, function)(self._handle, ctypes.byref(value)), function)
        return int(value.value)

    def _check(self, code: int, what: str) -> None:
        """Raises :class:`AotiRunError` with the library's last error when ``code`` != 0."""
        if code == 0:
            return
        message = ctypes.c_char_p()
        detail = ""
        if self._lib.AOTInductorGetLastError(ctypes.byref(message)) == 0 and message.value:
            detail = message.value.decode("utf-8", "replace").strip()
        raise AotiRunError(f"{self.path.name}: cannot {what}: {detail or f'error code {code}'}")

    def get_metadata(self) -> Mapping[str, str]:
        """The package's AOTInductor metadata (the same keys torch's loader reports)."""
        return dict(self._metadata)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One forward, GIL released for its whole length; flat outputs in order.

        Inputs are checked first (nothing is allocated for a refused one), then
        aliased, or copied where another thread could reallocate them (see the
        module docstring).

        Raises:
            ValueError: Wrong number of inputs, or an input that does not fit
                the package (the message names the input, its expected shape
                and dtype, and the reason).
            AotiRunError: The forward failed inside the library (e.g. the
                package's own input checks; its input handles may then leak),
                or an input's memory was reallocated during it.
            RuntimeError: The runner was closed.
        """
        check_inputs(self._specs, inputs)
        args = [self._own(t) for t in inputs]
        pointers = [t.untyped_storage().data_ptr() for t in args]
        with self._idle:
            if self._handle is None:
                raise RuntimeError(f"{self.path.name}: runner closed")
            handle = self._handle
            self._running += 1
        try:
            # The container steals (frees) the input handles; each holds its own
            # reference to its alias's storage, so the caller's tensors are untouched.
            capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(args)
            in_array = (_HANDLE * len(capsules))(*(self._capsule_get(c, None) for c in capsules))
            out_array = (_HANDLE * self.num_outputs)()
            code = self._lib.AOTInductorModelContainerRun(
                handle, in_array, len(in_array), out_array, self.num_outputs, None, None
            )
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()
        self._check(code, "run a forward")
        outputs = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(
            [self._capsule_new(p, None, None) for p in out_array]
        )
        _check_unmoved(self.path, args, pointers)
        return tuple(outputs)

    def _own(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor the library gets: an alias, or a copy where torch could reallocate it."""
        if self.private_inputs or not tensor.untyped_storage().resizable():
            return tensor.detach()
        return tensor.detach().clone()

    def close(self) -> None:
        """Frees the model container (weights included) once no forward runs; later calls raise."""
        with self._idle:
            handle, self._handle = self._handle, None
            self._idle.wait_for(lambda: self._running == 0)
        if handle is not None:
            self._check(self._lib.AOTInductorModelContainerDelete(handle), "delete the container")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone
            self.close()
