"""Admission control: requests counted in and out, staged tiles bounded, drain waits."""

from __future__ import annotations

import asyncio

import pytest

from predictor.errors import ModelNotReady, Overloaded
from predictor.model.admission import Admission


def test_staged_tiles_share_the_queue_bound():
    rejected = []
    admission = Admission("m", max_queue_size=10, retry_after_s=2.0, on_reject=rejected.append)
    with admission.staged(6, queue_depth=0):
        with (
            pytest.raises(Overloaded, match="6 tiles waiting \\+ 5 new > 10") as err,
            admission.staged(5, queue_depth=0),
        ):
            pass
        assert err.value.retry_after_s == 2.0
        with admission.staged(4, queue_depth=0):
            pass
    with pytest.raises(Overloaded), admission.staged(3, queue_depth=8):
        pass
    with admission.staged(10, queue_depth=0):
        pass
    assert rejected == [5, 3]


def test_draining_refuses_new_requests_and_wait_idle_waits_for_admitted():
    async def scenario():
        admission = Admission("m", max_queue_size=4, retry_after_s=1.0)
        release = asyncio.Event()

        async def one_request():
            with admission.request():
                await release.wait()

        task = asyncio.create_task(one_request())
        await asyncio.sleep(0)
        assert admission.admitted == 1
        admission.start_draining()
        with pytest.raises(ModelNotReady, match="draining"), admission.request():
            pass
        assert not await admission.wait_idle(0.01)
        release.set()
        assert await admission.wait_idle(5.0)
        await task
        assert admission.admitted == 0

    asyncio.run(scenario())


def test_bad_bound_is_refused():
    with pytest.raises(ValueError, match="max_queue_size"):
        Admission("m", max_queue_size=0, retry_after_s=1.0)


def test_decode_pixels_share_their_own_bound():
    """Issue 53, case 5: a 4-tile jpeg request may ask for a second of decoding; its pixels,
    not its tiles, are what fills stage 1."""
    rejected = []
    admission = Admission(
        "m",
        max_queue_size=1024,
        retry_after_s=2.0,
        max_decode_pixels=100,
        on_reject=rejected.append,
    )
    with admission.staged(4, queue_depth=0, decode_pixels=80):
        assert admission.decoding_pixels == 80
        with (
            pytest.raises(
                Overloaded, match=r"decode budget full \(80 pixels .* \+ 80 new > 100"
            ) as err,
            admission.staged(4, queue_depth=0, decode_pixels=80),
        ):
            pass
        assert err.value.retry_after_s == 2.0
        with admission.staged(4, queue_depth=0, decode_pixels=20):  # an ordinary one fits
            pass
        with admission.staged(32, queue_depth=0):  # raw pixels decode nothing: never refused
            pass
    assert admission.decoding_pixels == 0
    with admission.staged(4, queue_depth=0, decode_pixels=500):  # alone: always admitted
        pass
    assert rejected == [4]
