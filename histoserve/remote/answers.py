"""Every answer checked against its request and the model's description before any row is used.

A server (a bug, a proxy, another model behind the same URL) can answer
something that decodes fine and is still wrong: one row for a batch of four,
no outputs, a renamed output, FP64 instead of FP32, 768 floats where the model
gives 1536, NaNs. Used as they come, such answers would be spread over the
batch's tiles or leave zeros, and the slide would be written as done.

:class:`AnswerCheck` says, for one mode of one model (from its
:class:`~histoserve.remote.served_model.ServerInfo`), what an answer to ``n``
tiles must be:

- exactly the outputs the mode asks for (``embedding`` -> ``embedding``;
  ``prediction`` -> ``prediction``; ``prediction_with_embedding`` -> both; a
  tissue model -> ``mask``), none missing and no other;
- ``n`` rows each;
- the datatype and the trailing shape the server's model config (or gRPC
  metadata) lists for that output;
- only finite values in float outputs (embeddings and predictions are
  promised finite);
- when the answer names its model (V2's ``model_name``), the model asked;
- its package (``parameters.package_sha256``, which every histoserve answer
  carries) the package the model's config reported at the start of the run:
  a package swapped behind one URL mid-run, or replicas of two packages
  behind one Service mid-upgrade, must not mix two packages' features in one
  slide. When the config reported a digest, an answer naming none is refused
  too (the safe default: a histoserve server always names it; a server that
  reports no digest, e.g. gRPC metadata only or another V2 server, is not
  checked). :func:`identity_problem` is that check, shared with the slide
  head's (:mod:`histoserve.heads.head`); every URL's config is also compared
  up front by :func:`~histoserve.remote.served_model.fetch_server_info`;
- for a request of the slide's own JPEG tiles, where they were decoded
  (``parameters.jpeg_decode``): ``cpu`` for ``--transport jpeg``, ``device``
  for ``jpeg-device`` (:meth:`AnswerCheck.for_transport`); missing or other is
  refused, so device-decoded features never land in a CPU cohort, nor the
  reverse. Pixel requests are not checked for it.

Anything else raises :class:`~histoserve.errors.BadAnswer`, a
:class:`~histoserve.errors.RetryableError`: the dispatcher
treats it as a failed attempt, exactly like a 503 (retried, preferably on
another URL), and when attempts run out the slide fails with the URL and
what was wrong. A wrong answer is never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from histoserve import wire
from histoserve.errors import BadAnswer, UsageError
from histoserve.remote.transport import answer_bound
from histoserve.slides.tiff.wire_tiles import DECODED_ON

if TYPE_CHECKING:
    from histoserve.remote.served_model import ServerInfo

MODE_OUTPUTS = wire.MODE_OUTPUTS
"""The outputs each mode asks for (declared once, in :mod:`histoserve.wire.modes`)."""
TISSUE_OUTPUTS = wire.MASK_OUTPUTS
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


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
        model: The model asked ("": not checked): an answer naming another fails.
        package_sha256: The package the config reported ("": not checked): an
            answer naming another package fails.
        jpeg_decode: Where the request's JPEG tiles must have been decoded
            (``cpu``, ``device``; "": a pixel request, not checked).
    """

    outputs: tuple[Expected, ...]
    mode: str = ""
    model: str = ""
    package_sha256: str = ""
    jpeg_decode: str = ""

    @classmethod
    def for_mode(cls, info: ServerInfo, mode: str) -> AnswerCheck:
        """The check for ``mode`` requests to the model ``info`` describes."""
        expected = _expected(info, MODE_OUTPUTS[mode])
        return cls(expected, f"mode {mode!r}", info.model, info.reported_sha256)

    @classmethod
    def for_request(cls, info: ServerInfo, mode: str | None) -> AnswerCheck:
        """The check for a request of ``mode`` (None: the model's default) to the model ``info``
        describes, read off what its config declares: a model answering ``mask`` is a tissue
        model (:meth:`for_tissue`), any other answers the outputs its mode asks.

        A mode the client does not know (the server refuses it, or answers what it
        pleases) must answer the outputs the config lists, each with one row per tile.

        Raises:
            UsageError: A slide head (it takes ``features``): its answers are one
                slide's, checked by :class:`~histoserve.heads.head.SlideAnswerCheck`.
        """
        if info.takes_features:
            raise UsageError(
                f"model {info.model!r} is a slide head (it takes 'features'): run it with "
                "histoserve.aggregate (or pass its check)"
            )
        if info.answers_masks:
            return cls.for_tissue(info)
        mode = mode or (info.modes[0] if info.modes else "embedding")
        if mode in MODE_OUTPUTS:
            return cls.for_mode(info, mode)
        listed = _expected(info, tuple(info.outputs))
        return cls(listed, f"mode {mode!r}", info.model, info.reported_sha256)

    @classmethod
    def for_tissue(cls, info: ServerInfo) -> AnswerCheck:
        """The check for requests to a tissue-segmentation model (``mask``)."""
        expected = _expected(info, TISSUE_OUTPUTS)
        return cls(expected, f"tissue model {info.model!r}", info.model, info.reported_sha256)

    def for_transport(self, transport: str) -> AnswerCheck:
        """This check for requests sent by ``transport`` (``pixels``, ``jpeg``, ``jpeg-device``)."""
        return replace(self, jpeg_decode=DECODED_ON.get(transport, ""))

    def max_answer_bytes(self, n_tiles: int) -> int:
        """The most bytes an answer to ``n_tiles`` tiles can need (larger ones are not read)."""
        per_row = 0
        for expected in self.outputs:
            trailing = expected.shape[1:] if expected.shape is not None else (-1,)
            if any(d < 0 for d in trailing):
                return answer_bound(n_tiles, None)
            per_row += int(np.prod(trailing, dtype=np.int64))
        return answer_bound(n_tiles, per_row)

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
        problem = self._identity_problem(getattr(answer, "identity", None) or {})
        if problem is not None:
            return problem
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

    def _identity_problem(self, identity: Mapping[str, object]) -> str | None:
        return identity_problem(identity, self.model, self.package_sha256, self.jpeg_decode)


DIGEST_CHARS = 16
"""Hex digits of a package digest quoted in messages."""


def identity_problem(
    identity: Mapping[str, object], model: str, package_sha256: str, jpeg_decode: str = ""
) -> str | None:
    """What says an answer came from another model, package or JPEG decode than the run's, or None.

    Args:
        identity: The answer's ``model_name`` and ``parameters`` (those it carries).
        model: The model asked ("": not checked).
        package_sha256: The package the model's config reported at the start of
            the run ("": none reported, not checked).
        jpeg_decode: Where the request's JPEG tiles must have been decoded
            (``cpu``, ``device``; "": not checked, a pixel request).
    """
    name = identity.get("model_name")
    if model and name and str(name) != model:
        return f"answered as model {str(name)[:80]!r}, not {model!r} (another model there?)"
    parameters = identity.get("parameters")
    parameters = parameters if isinstance(parameters, Mapping) else {}
    decoded = parameters.get("jpeg_decode")
    if jpeg_decode and str(decoded) != jpeg_decode:
        said = f"on {str(decoded)[:40]!r}" if decoded else "without saying where"
        flag = "jpeg-device" if jpeg_decode == "device" else "jpeg or auto"
        return (
            f"decoded the request's JPEG tiles {said} (parameters.jpeg_decode), not on "
            f"{jpeg_decode!r} as --transport {flag} asks: not used "
            "(device-decoded tiles give other features than the CPU's; a cohort never mixes them)"
        )
    if not package_sha256:
        return None
    digest = parameters.get("package_sha256")
    want = package_sha256[:DIGEST_CHARS]
    if not digest:
        return (
            f"answered without naming its package (no parameters.package_sha256), though its "
            f"config reported package {want} at the start of the run: not used (a histoserve "
            "server names its package in every answer)"
        )
    if str(digest) != package_sha256:
        return (
            f"answered with package {str(digest)[:DIGEST_CHARS]}, not {want} that its config "
            "reported at the start of the run (the package behind this URL changed mid-run, "
            "or replicas of two packages serve it)"
        )
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
