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
    * Inputs must be contiguous (the package reads raw NCHW memory and checks
      nothing): a non-contiguous input is a ``ValueError``, never a silent
      wrong answer. A failed forward raises :class:`AotiRunError` with the
      library's own message (``AOTInductorGetLastError``).
    * ``num_models`` copies of the model share one container: up to that many
      threads run forwards at once (Triton's instance groups); more wait.
    * CPU only: on CUDA the forward only launches kernels, so the GIL is held
      for microseconds anyway; use torch's loader there.

The handles passing tensors across the ABI come from torch's own helpers
(``torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors`` and
``alloc_tensors_by_stealing_from_void_ptrs``), the ones torch's
``cpp_wrapper`` path uses for the same ctypes call.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import shutil
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

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


def _member(names: list[str], model_name: str, suffix: str, path: Path) -> str:
    """The one zip member ``*/data/aotinductor/<model_name>/*<suffix>`` (wrapper first)."""
    folder = f"data/aotinductor/{model_name}/"
    found = [n for n in names if folder in n and n.endswith(suffix)]
    wrapper = [n for n in found if "wrapper" in n.rsplit("/", 1)[-1]]
    found = wrapper or found
    if len(found) != 1:
        raise ValueError(
            f"{path}: expected one {folder}*{suffix} in the package, found {len(found)}: {found}"
        )
    return found[0]


def extract_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Writes one member of ``archive`` (opened from a file) to ``target``, checking its CRC-32.

    torch stores a package's library uncompressed; such a member is copied by
    the kernel (``os.copy_file_range``: no Python buffers; a 2.2 GB ViT-g
    ``.so`` took 1.3-2.4 s here against 7-9 s through :mod:`zipfile`) and its
    CRC-32 is then checked over the archive's bytes (from the page cache).
    A compressed member, or a kernel without the call, goes through
    :mod:`zipfile` (which checks the CRC as it reads).

    Raises:
        zipfile.BadZipFile: The member's bytes do not match its CRC-32.
    """
    if info.compress_type == zipfile.ZIP_STORED and hasattr(os, "copy_file_range"):
        with open(str(archive.filename), "rb") as src, target.open("wb") as dst:
            offset = _data_offset(src, info)
            try:
                _copy_range(src.fileno(), dst.fileno(), offset, info.file_size)
            except OSError:
                dst.truncate(0)  # e.g. a filesystem without the call: copy below
            else:
                if _crc32(src.fileno(), offset, info.file_size) != info.CRC:
                    raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
                return
    with archive.open(info) as member, target.open("wb") as dst:
        shutil.copyfileobj(member, dst, 1 << 22)


def _data_offset(fh: Any, info: zipfile.ZipInfo) -> int:
    """Where a member's bytes start: after its local header, name and extra field."""
    fh.seek(info.header_offset)
    header = fh.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename!r}")
    name_len, extra_len = (
        int.from_bytes(header[26:28], "little"),
        int.from_bytes(header[28:30], "little"),
    )
    return info.header_offset + 30 + name_len + extra_len


def _copy_range(src: int, dst: int, offset: int, size: int) -> None:
    done = 0
    while done < size:
        copied = os.copy_file_range(src, dst, size - done, offset + done, done)
        if copied == 0:
            raise zipfile.BadZipFile("the archive ends inside a member (truncated)")
        done += copied


def _crc32(fd: int, offset: int, size: int) -> int:
    crc = 0
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            for start in range(offset, offset + size, 1 << 26):
                crc = zlib.crc32(view[start : min(start + (1 << 26), offset + size)], crc)
        finally:
            view.release()
    return crc


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
            :meth:`~predictor.package.loader.StartupPhases.time`, so a cold
            start reports extraction apart from ``dlopen``).

    Raises:
        ValueError: A CUDA device, ``num_models`` < 1, or a package without
            exactly one model library.
        AotiRunError: The library refused to create the model.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        *,
        model_name: str = "model",
        num_models: int = 1,
        metadata: Mapping[str, str] | None = None,
        extraction_timer: Callable[[str], AbstractContextManager[None]] | None = None,
    ) -> None:
        device = torch.device(device)
        if device.type != "cpu":
            raise ValueError(f"GilFreeRunner runs CPU packages only, got device {device}")
        if num_models < 1:
            raise ValueError(f"num_models must be >= 1, got {num_models}")
        self.path = Path(path)
        self.num_models = num_models
        self._idle = threading.Condition()  # close() waits until no forward is running
        self._running = 0
        self._handle: ctypes.c_void_p | None = None
        timer = extraction_timer or (lambda _phase: contextlib.nullcontext())
        tmp = Path(tempfile.mkdtemp(prefix="histoserve_aoti_"))
        try:
            self._metadata, self._lib = self._extract_and_open(model_name, metadata, timer, tmp)
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

    def _extract_and_open(
        self,
        model_name: str,
        metadata: Mapping[str, str] | None,
        timer: Callable[[str], AbstractContextManager[None]],
        tmp: Path,
    ) -> tuple[dict[str, str], ctypes.CDLL]:
        """Reads the metadata (unless given) and dlopens the model library (extracted into ``tmp``).

        The caller removes ``tmp`` once the model container exists: the
        library's mapping stays valid, and nothing is left behind in ``$TMPDIR``.
        """
        with zipfile.ZipFile(self.path) as archive:
            names = archive.namelist()
            so_name = _member(names, model_name, _SO_SUFFIX, self.path)
            if metadata is None:
                try:
                    meta_name = _member(names, model_name, _METADATA_SUFFIX, self.path)
                    metadata = json.loads(archive.read(meta_name))
                except ValueError:
                    metadata = {}
            target = tmp / Path(so_name).name
            with timer("extraction"):
                extract_member(archive, archive.getinfo(so_name), target)
            lib = ctypes.CDLL(str(target), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        _bind(lib)
        return {str(k): str(v) for k, v in metadata.items()}, lib

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

        Raises:
            ValueError: Wrong number of inputs, or a non-contiguous input.
            AotiRunError: The forward failed inside the library (e.g. the
                package's own input checks).
            RuntimeError: The runner was closed.
        """
        if len(inputs) != self.num_inputs:
            raise ValueError(f"expected {self.num_inputs} input tensors, got {len(inputs)}")
        for i, tensor in enumerate(inputs):
            if not tensor.is_contiguous():
                raise ValueError(f"input {i} must be contiguous (stride {tensor.stride()})")
        with self._idle:
            if self._handle is None:
                raise RuntimeError(f"{self.path.name}: runner closed")
            handle = self._handle
            self._running += 1
        try:
            # The container steals (frees) the input handles; each holds its own
            # reference to the tensor's storage, so the caller's tensors are untouched.
            capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(inputs))
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
        return tuple(outputs)

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
