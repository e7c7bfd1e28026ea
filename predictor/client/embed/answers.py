"""Every answer checked against its request and the model's description before any row is used.

A server (a bug, a proxy, another model behind the same URL) can answer
something that decodes fine and is still wrong: one row for a batch of four,
no outputs, a renamed output, FP64 instead of FP32, 768 floats where the model
gives 1536, NaNs. Used as they come, such answers would be spread over the
batch's tiles or leave zeros, and the slide would be written as done.

:class:`AnswerCheck` says, for one mode of one model (from its
:class:`~predictor.client.embed.remote.ServerInfo`), what an answer to ``n``
tiles must be:

- exactly the outputs the mode asks for (``embedding`` -> ``embedding``;
  ``prediction`` -> ``prediction``; ``prediction_with_embedding`` -> both; a
  tissue model -> ``mask``), none missing and no other;
- ``n`` rows each;
- the datatype and the trailing shape the server's model config (or gRPC
  metadata) lists for that output;
- only finite values in float outputs (embeddings and predictions are
  promised finite).

Anything else raises :class:`BadAnswer`, a
:class:`~predictor.client.embed.transport.RetryableError`: the dispatcher
treats it as a failed attempt, exactly like a 503 (retried, preferably on
another URL), and when attempts run out the slide fails with the URL and
what was wrong. A wrong answer is never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from predictor import wire
from predictor.client.embed.transport import RetryableError

if TYPE_CHECKING:
    from predictor.client.embed.remote import ServerInfo

MODE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "embedding": ("embedding",),
    "prediction": ("prediction",),
    "prediction_with_embedding": ("prediction", "embedding"),
}
"""The outputs each mode asks for."""
TISSUE_OUTPUTS = ("mask",)
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


class BadAnswer(RetryableError):
    """An answer that does not fit its request: a failed attempt, retried elsewhere like a 503."""


@dataclass(frozen=True)
class Expected:
    """One output an answer must carry.

    Attributes:
        name: Output name.
        datatype: V2 datatype (``FP32``, ``UINT8``, ...); None: not known, not checked.
        shape: Shape with the batch axis first, ``-1`` where any size goes;
            None: not known (only the rows are checked).
    """

    name: str
    datatype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AnswerCheck:
    """What every answer of one request kind must be (see the module docstring).

    Attributes:
        outputs: The outputs asked for, each with its datatype and shape.
        mode: What asked for them, for messages (``mode 'embedding'``, ``the tissue model``).
    """

    outputs: tuple[Expected, ...]
    mode: str = ""

    @classmethod
    def for_mode(cls, info: ServerInfo, mode: str) -> AnswerCheck:
        """The check for ``mode`` requests to the model ``info`` describes."""
        return cls(_expected(info, MODE_OUTPUTS[mode]), f"mode {mode!r}")

    @classmethod
    def for_tissue(cls, info: ServerInfo) -> AnswerCheck:
        """The check for requests to a tissue-segmentation model (``mask``)."""
        return cls(_expected(info, TISSUE_OUTPUTS), f"tissue model {info.model!r}")

    def verify(self, answer: Mapping[str, object], n_tiles: int, url: str) -> None:
        """Returns when ``answer`` fits a request of ``n_tiles`` tiles.

        Raises:
            BadAnswer: ``"<url>: <what was wrong>"``.
        """
        problem = self.problem(answer, n_tiles)
        if problem is not None:
            raise BadAnswer(f"{url}: {problem} (a wrong answer, not used)")

    def problem(self, answer: Mapping[str, object], n_tiles: int) -> str | None:
        """What is wrong with ``answer`` to ``n_tiles`` tiles, or None."""
        wanted = [e.name for e in self.outputs]
        got = sorted(answer)
        for name in wanted:
            if name not in answer:
                others = ", ".join(repr(g) for g in got) or "none"
                return f"no {name!r} output ({self.mode} asks for it; it answered {others})"
        extra = [g for g in got if g not in wanted]
        if extra:
            asked = ", ".join(repr(w) for w in wanted)
            return f"unexpected output {extra[0]!r} ({self.mode} asks for {asked} only)"
        for expected in self.outputs:
            problem = _output_problem(expected, answer[expected.name], n_tiles)
            if problem is not None:
                return problem
        return None


def _expected(info: ServerInfo, names: tuple[str, ...]) -> tuple[Expected, ...]:
    out = []
    for name in names:
        datatype, shape = info.outputs.get(name, (None, None))
        out.append(Expected(name, datatype, tuple(shape) if shape is not None else None))
    return tuple(out)


def _output_problem(expected: Expected, values: object, n_tiles: int) -> str | None:
    name = expected.name
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        return f"{name!r} is not an array of rows"
    rows = values.shape[0]
    if rows != n_tiles:
        return f"answered {rows} row{'s' * (rows != 1)} for {n_tiles} tiles (output {name!r})"
    try:
        datatype = wire.datatype_of(values)
    except ValueError:
        datatype = str(values.dtype)
    if expected.datatype is not None and datatype != expected.datatype:
        return f"{name} is {datatype}, expected {expected.datatype}"
    if expected.shape is not None:
        want = (n_tiles, *expected.shape[1:])
        fits = len(want) == values.ndim and all(
            w in (-1, g) for w, g in zip(want, values.shape, strict=True)
        )
        if not fits:
            return f"{name} has shape {list(values.shape)}, expected {list(want)}"
    if datatype in _FLOATS:
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        if bad:
            return f"{name} has {bad} non-finite value{'s' * (bad != 1)} (NaN or infinity)"
    return None
