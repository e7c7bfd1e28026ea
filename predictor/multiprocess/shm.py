"""Shared-memory slabs: where a front end's tiles and their answers cross to the device owner.

One slab per front end, created by the device owner (which outlives every
front end, so it alone unlinks them) and attached by the front end. A slab
is cut into equal slots, one per sample in flight: the sample's tile and
extra tensors at the start, its outputs after them. The front end copies a
prepared sample into a free slot (the one copy on the way in; pixels are
never pickled), the owner views it as numpy arrays for the batch, writes the
outputs into the same slot and the front end copies them out (a few kB per
tile) before freeing the slot.

Only plain numbers cross (:data:`NUMERIC_KINDS`): an array of Python objects
would cross as raw pointers into another process's heap. A segment is
allocated whole when it is created (:mod:`predictor.multiprocess.segments`), so a
``/dev/shm`` too small is a start-up error, never a SIGBUS mid-request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.errors import ForwardError
from predictor.multiprocess.segments import SHM_DIR, Segment

ALIGN = 64
"""Every array in a slot starts at a multiple of this (cache lines, SIMD loads)."""

NUMERIC_KINDS = frozenset("biufc")
"""numpy dtype kinds that may cross: bool, signed, unsigned, float, complex."""

ArrayDesc = tuple[str, str, tuple[int, ...], int]
"""``(name, dtype string, shape, offset in the slab)`` of one array in a slot."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class SlotLayout:
    """The size of a slot and where its outputs start.

    Attributes:
        input_bytes: Room for a tile and its extra tensors (aligned).
        output_bytes: Room for one sample's outputs (aligned).
        slots: How many slots the slab holds.
    """

    input_bytes: int
    output_bytes: int
    slots: int

    @property
    def slot_bytes(self) -> int:
        """Bytes per slot."""
        return self.input_bytes + self.output_bytes

    @property
    def slab_bytes(self) -> int:
        """Bytes of the whole slab."""
        return self.slot_bytes * self.slots


def layout_for(
    tile_size: int,
    extra_bytes: int,
    output_bytes: int,
    slots: int,
) -> SlotLayout:
    """A layout with room for a ``uint8`` tile, ``extra_bytes`` of inputs and ``output_bytes``.

    Raises:
        ValueError: ``slots`` below 1.
    """
    if slots < 1:
        raise ValueError(f"a slab needs at least one slot, got {slots}")
    # Each array may waste up to ALIGN bytes to its alignment: allow a few.
    tile = _aligned(tile_size * tile_size * 3)
    return SlotLayout(
        input_bytes=tile + _aligned(extra_bytes) + 4 * ALIGN,
        output_bytes=_aligned(output_bytes) + 8 * ALIGN,
        slots=slots,
    )


class Slab:
    """One front end's shared-memory slab, seen from either side.

    Args:
        segment: The mapped segment.
        layout: How it is cut into slots.
        owner: True in the device owner, which unlinks the segment on close.
    """

    def __init__(self, segment: Segment, layout: SlotLayout, *, owner: bool) -> None:
        self._segment = segment
        self.layout = layout
        self._owner = owner
        self._free = list(range(layout.slots - 1, -1, -1))  # pop() hands out slot 0 first

    @classmethod
    def create(cls, layout: SlotLayout, folder: Path = SHM_DIR) -> Slab:
        """A new slab, every page allocated (in the device owner).

        Raises:
            ShmTooSmall: ``folder`` cannot hold it.
        """
        return cls(Segment.create(layout.slab_bytes, folder), layout, owner=True)

    @classmethod
    def attach(cls, name: str, layout: SlotLayout, folder: Path = SHM_DIR) -> Slab:
        """The owner's slab ``name`` (in a front end, which never unlinks it).

        Raises:
            ValueError: The segment is not one of ours or smaller than ``layout``.
            OSError: It does not exist.
        """
        segment = Segment.attach(name, folder)
        if len(segment.buf) < layout.slab_bytes:
            segment.close(unlink=False)
            raise ValueError(f"segment {name} is smaller than its layout")
        return cls(segment, layout, owner=False)

    @property
    def name(self) -> str:
        """The segment's name (what the other side attaches)."""
        return self._segment.name

    @property
    def free_slots(self) -> int:
        """Slots not holding a sample now."""
        return len(self._free)

    # -- front end: slots -------------------------------------------------------------------
    def take(self, n: int) -> list[int] | None:
        """``n`` free slots, or None (nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def give_back(self, slots: Sequence[int]) -> None:
        """Frees ``slots`` (their answers were read)."""
        self._free.extend(reversed(slots))

    def write_inputs(self, slot: int, tile: Any, extras: Mapping[str, Any]) -> list[ArrayDesc]:
        """Copies a prepared sample's tile and extra tensors into ``slot``; their descriptors.

        The tile comes first, named ``""``. A numpy array or a host tensor
        (anything ``np.asarray`` reads) each.

        Raises:
            ForwardError: The sample does not fit its slot (a model whose
                inputs outgrow what its metadata declared).
        """
        start = slot * self.layout.slot_bytes
        return self._write(start, self.layout.input_bytes, [("", tile), *extras.items()])

    def write_outputs(self, slot: int, outputs: Mapping[str, Any]) -> list[ArrayDesc]:
        """Copies one sample's outputs into ``slot`` (in the owner); their descriptors."""
        start = slot * self.layout.slot_bytes + self.layout.input_bytes
        return self._write(start, self.layout.output_bytes, list(outputs.items()))

    def _write(self, start: int, room: int, arrays: list[tuple[str, Any]]) -> list[ArrayDesc]:
        descs: list[ArrayDesc] = []
        offset = start
        for name, value in arrays:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            _check_numeric(name, array.dtype)
            end = offset + array.nbytes
            if end > start + room:
                raise ForwardError(
                    f"{name or 'tile'} of {array.nbytes} bytes does not fit the shared-memory slot "
                    f"({room} bytes): the model's inputs or outputs outgrow what it declared"
                )
            target = np.ndarray(array.shape, array.dtype, buffer=self._segment.buf, offset=offset)
            target[...] = array
            descs.append((name, array.dtype.str, tuple(array.shape), offset))
            offset = _aligned(end)
        return descs

    # -- either side: views ------------------------------------------------------------------
    def view(self, desc: ArrayDesc) -> np.ndarray:
        """The array ``desc`` describes, as a view into the slab (no copy).

        Raises:
            ForwardError: A dtype that is not a plain number, or a view outside the slab.
        """
        name, dtype, shape, offset = desc
        kind = np.dtype(dtype)
        _check_numeric(name, kind)
        try:
            return np.ndarray(shape, kind, buffer=self._segment.buf, offset=offset)
        except (TypeError, ValueError) as exc:
            raise ForwardError(f"{name or 'tile'}: not a view of this slab: {exc}") from exc

    def close(self) -> None:
        """Unmaps the slab (and, in the owner, unlinks it and drops its lock).

        A view still alive somewhere keeps the mapping (closing it then would
        pull the memory from under that view); the name is unlinked anyway.
        """
        self._segment.close(unlink=self._owner)


def _check_numeric(name: str, dtype: np.dtype) -> None:
    if dtype.kind not in NUMERIC_KINDS:
        raise ForwardError(
            f"{name or 'tile'} has dtype {dtype}: only numbers cross between processes"
        )
