"""Stage 1 in a thread pool: prepare every tile of a request, in order.

Decoding PNG/JPEG releases the GIL, so a request's tiles are split into one
chunk per pool thread and prepared in parallel. Raw ``pixels`` need no decoding:
they are prepared inline, where a thread hop would cost more than the work.
A slide's features (one item, up to hundreds of MB) go to a thread too.
The first invalid tile fails the whole request with its index named: a
``ValueError`` from ``prepare_sample`` (the seed's contract for a bad
request), and a prepared tile in neither layout
(:func:`~predictor.codecs.samples.tile_hwc`), are a 400, never a batch's
failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from predictor.codecs.samples import ModelRequest, PreparedSample, tile_hwc
from predictor.errors import InvalidInput

PrepareFn = Callable[[ModelRequest], PreparedSample]


class Stage1Pool:
    """Runs ``prepare_sample`` over a request's tiles on ``threads`` pool threads.

    Its size is the ``--preprocess_workers`` flag (the flag's name is a
    contract; inside the server these are the decode pool's threads, and a
    "worker" is a device worker, :mod:`predictor.batching.worker`).

    Args:
        threads: The pool's threads.
        tile_size: The spec's tile size, that every prepared tile must have.
    """

    def __init__(self, threads: int, tile_size: int):
        if threads < 1:
            raise ValueError(f"preprocess_workers (the pool's threads) must be >= 1, got {threads}")
        self._threads = threads
        self._tile_size = tile_size
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="histoserve-prep")

    async def prepare(
        self, items: Sequence[ModelRequest], tile_input: str, prepare: PrepareFn
    ) -> list[PreparedSample]:
        """Prepared samples in item order; ``InvalidInput`` located at the first bad tile."""
        if not any(_decodes(item) for item in items):
            return prepare_chunk(items, tile_input, prepare, self._tile_size)
        size = max(1, -(-len(items) // self._threads))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        loop = asyncio.get_running_loop()
        jobs = [
            loop.run_in_executor(
                self._pool, prepare_chunk, chunk, tile_input, prepare, self._tile_size
            )
            for chunk in chunks
        ]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [sample for chunk in results for sample in chunk]

    def shutdown(self) -> None:
        """Stops the threads; queued work is cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _decodes(item: ModelRequest) -> bool:
    """Whether preparing ``item`` is work worth a thread (decoding, a slide's features)."""
    return item.image_data is not None or item.features is not None or item.jpeg is not None


def prepare_chunk(
    items: Sequence[ModelRequest], tile_input: str, prepare: PrepareFn, tile_size: int
) -> list[PreparedSample]:
    """Prepares ``items`` one by one, naming the input and tile of a failure.

    Raises:
        InvalidInput: ``prepare`` raised a ``ValueError`` (``InvalidInput``
            included), or returned a tile that is not ``tile_size`` square
            RGB ``uint8`` in HWC or CHW.
    """
    prepared = []
    for item in items:
        try:
            sample = prepare(item)
            if (
                item.features is None and sample.tile is not item.jpeg
            ):  # features, or a deferred region
                tile_hwc(sample.tile, tile_size)
        except InvalidInput as exc:
            raise exc.at(input_name=tile_input, tile=item.index) from exc
        except ValueError as exc:
            raise InvalidInput(str(exc), input_name=tile_input, tile=item.index) from exc
        prepared.append(sample)
    return prepared
