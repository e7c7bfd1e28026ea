"""What the served package is, as requests see it: its digest, its dtype, what answers say of it.

Mixed into :class:`~predictor.model.hooks.TileHooks`. In one process the
loaded package says; a front end (``--frontends``) never loads it, so it
takes the device owner's ``/config`` answer (:meth:`ServedPackage.served_from`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from predictor.pt2.loader import LoadedPackage
from predictor.pt2.metadata import package_input_dtype


class ServedPackage:
    """The served package's facts; ``_package`` and ``_owner_config`` are set by the model."""

    _package: LoadedPackage | None
    _owner_config: Mapping[str, Any]

    def served_from(self, owner_config: Mapping[str, Any]) -> None:
        """A front end's package facts: the device owner's config (it never loads the package)."""
        self._owner_config = dict(owner_config)

    @property
    def package_sha256(self) -> str:
        """The served package's SHA-256 ("" before it is known)."""
        if self._package is not None:
            return self._package.sha256
        return str(self._owner_config.get("package_sha256") or "")

    @property
    def package_dtype(self) -> torch.dtype:
        """The dtype the package computes in (its tile input's); float32 before it is known."""
        if self._package is not None:
            return self._package.input_dtype
        metadata = self._owner_config.get("package_metadata")
        return package_input_dtype(metadata) if metadata else torch.float32

    def answer_parameters(self) -> dict[str, str]:
        """What every answer says about who made it: ``package_sha256``, the served package's digest.

        Sent in every V2 answer (REST and gRPC ``parameters``), so a client
        notices when the package behind its URL changed mid-run.
        """
        digest = self.package_sha256
        return {"package_sha256": digest} if digest else {}
