"""What the served package is, as requests see it: its digest, its dtype, what answers say of it.

A part the model's package side owns and hands its family (``model.served``).
In one process the package side (:class:`~predictor.model.device_side.DeviceSide`)
binds the loaded package once it is checked and releases it at stop; a front
end (``--frontends``) never loads the package, so its facts are the device
owner's ``/config`` answer, given at construction
(:meth:`ServedPackage.from_owner`). Nothing else writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from predictor.codecs.jpeg_input import JpegRegion
from predictor.codecs.samples import PreparedSample
from predictor.model.device_jpeg import JpegDecodePlace
from predictor.packages.metadata import package_input_dtype
from predictor.runtime.loader import LoadedPackage


class ServedPackage:
    """The served package's facts: the package once loaded, or a front end's owner config.

    Attributes:
        package: The first device's loaded package (``None`` in a front end,
            and until the package side binds it).
        jpeg: Where jpeg-transport tiles decode when on a device (bound with
            the package only when they do); ``None``: in stage 1, on the CPU.
    """

    def __init__(self, package: LoadedPackage | None = None) -> None:
        self.package = package
        self.jpeg: JpegDecodePlace | None = None
        self._owner_config: Mapping[str, Any] = {}

    @classmethod
    def from_owner(cls, owner_config: Mapping[str, Any]) -> ServedPackage:
        """A front end's package facts: the device owner's config (it never loads the package)."""
        served = cls()
        served._owner_config = dict(owner_config)
        return served

    def bind(self, package: LoadedPackage, jpeg: JpegDecodePlace | None) -> None:
        """The package side's load: the checked package, and where its JPEG tiles decode."""
        self.package = package
        self.jpeg = jpeg

    def release(self) -> None:
        """The package side's stop: the package is dropped (its loader's files go with it)."""
        self.package = None

    @property
    def package_sha256(self) -> str:
        """The served package's SHA-256 ("" before it is known)."""
        if self.package is not None:
            return self.package.sha256
        return str(self._owner_config.get("package_sha256") or "")

    @property
    def package_dtype(self) -> torch.dtype:
        """The dtype the package computes in (its tile input's); float32 before it is known."""
        if self.package is not None:
            return self.package.input_dtype
        metadata = self._owner_config.get("package_metadata")
        return package_input_dtype(metadata) if metadata else torch.float32

    @property
    def jpeg_decode(self) -> str:
        """Where this process decodes jpeg-transport tiles: ``device`` or ``cpu``.

        A front end decodes in its own stage 1, on the CPU, whatever the
        device owner would do.
        """
        return "cpu" if self.jpeg is None else "device"

    def answer_parameters(self, samples: Sequence[PreparedSample] = ()) -> dict[str, str]:
        """What every answer says about who made it: the package's digest, where JPEG tiles decode.

        Sent in every V2 answer (REST and gRPC ``parameters``), so a client
        notices when the package behind its URL changed mid-run
        (``package_sha256``) and never mixes features from tiles decoded on
        a device with the CPU decode's (``jpeg_decode``: ``device`` when
        this request's tiles waited for the device, else ``cpu``; a
        request is decoded in one place, :mod:`predictor.model.device_jpeg`).
        """
        digest = self.package_sha256
        facts = {"package_sha256": digest} if digest else {}
        on_device = self.jpeg is not None and any(isinstance(s.tile, JpegRegion) for s in samples)
        return {**facts, "jpeg_decode": "device" if on_device else "cpu"}
