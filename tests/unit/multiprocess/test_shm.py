"""Shared-memory slabs: samples in, outputs out, slots reused, between two real mappings.

Both sides here are this process (the owner's creating mapping and a front
end's attached one are separate mappings of the same segment), so what one
writes the other must read, byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor.errors import ForwardError
from predictor.multiprocess.segments import SHM_DIR
from predictor.multiprocess.shm import ALIGN, Slab, layout_for


@pytest.fixture
def slabs():
    layout = layout_for(tile_size=8, extra_bytes=16 * 4, output_bytes=32 * 4, slots=3)
    owner = Slab.create(layout)
    frontend = Slab.attach(owner.name, layout)
    yield owner, frontend
    frontend.close()
    owner.close()


def test_a_sample_crosses_without_change_and_its_outputs_come_back(slabs):
    owner, frontend = slabs
    tile = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    rna = np.arange(16, dtype=np.float32)
    (slot,) = frontend.take(1)
    descs = frontend.write_inputs(slot, tile, {"bulk_rna": rna})
    assert [d[0] for d in descs] == ["", "bulk_rna"]
    assert all(d[3] % ALIGN == 0 for d in descs)
    seen_tile, seen_rna = owner.view(descs[0]), owner.view(descs[1])
    assert np.array_equal(seen_tile, tile) and np.array_equal(seen_rna, rna)
    outputs = owner.write_outputs(slot, {"embedding": np.linspace(0, 1, 32, dtype=np.float32)})
    got = frontend.view(outputs[0]).copy()
    assert np.array_equal(got, np.linspace(0, 1, 32, dtype=np.float32))
    assert outputs[0][3] >= descs[1][3] + rna.nbytes  # outputs never overwrite inputs


def test_a_chw_tile_and_a_torch_tensor_cross_as_they_are(slabs):
    import torch

    owner, frontend = slabs
    tile = torch.arange(3 * 8 * 8, dtype=torch.uint8).reshape(3, 8, 8)
    (slot,) = frontend.take(1)
    (desc,) = frontend.write_inputs(slot, tile, {})
    assert np.array_equal(owner.view(desc), tile.numpy())


def test_slots_are_all_or_none_and_last_freed_first(slabs):
    _, frontend = slabs
    first = frontend.take(2)
    assert first == [0, 1]
    assert frontend.take(2) is None and frontend.free_slots == 1
    frontend.give_back(first)
    assert frontend.take(1) == [0]


def test_what_outgrows_its_slot_is_a_forward_error(slabs):
    owner, frontend = slabs
    (slot,) = frontend.take(1)
    with pytest.raises(ForwardError, match="does not fit"):
        frontend.write_inputs(slot, np.zeros((64, 64, 3), np.uint8), {})
    with pytest.raises(ForwardError, match="embedding"):
        owner.write_outputs(slot, {"embedding": np.zeros(4096, np.float64)})


def test_the_owner_unlinks_and_the_front_end_does_not():
    layout = layout_for(tile_size=4, extra_bytes=0, output_bytes=16, slots=1)
    owner = Slab.create(layout)
    frontend = Slab.attach(owner.name, layout)
    frontend.close()
    assert (SHM_DIR / owner.name).exists()
    owner.close()
    assert not (SHM_DIR / owner.name).exists()
    with pytest.raises(FileNotFoundError):
        Slab.attach(owner.name, layout)


@pytest.mark.parametrize("value", [np.array(["a", None], dtype=object), np.array(["ab"])])
def test_only_numbers_cross_never_object_pointers(slabs, value):
    owner, frontend = slabs
    (slot,) = frontend.take(1)
    with pytest.raises(ForwardError, match="only numbers cross"):
        owner.write_outputs(slot, {"labels": value})
    with pytest.raises(ForwardError, match="only numbers cross"):  # a descriptor naming one
        frontend.view(("labels", "|O", (2,), 0))


def test_a_view_outside_the_slab_is_refused(slabs):
    owner, _ = slabs
    with pytest.raises(ForwardError, match="not a view of this slab"):
        owner.view(("embedding", "<f4", (1 << 20,), 0))
