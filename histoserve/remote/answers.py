"""Every answer checked against its request and the model's description before any row is used.

A server (a bug, a proxy, another model or package behind the same URL) can
answer something that decodes fine and is still wrong: one row for a batch
of four, no outputs, a renamed output, FP64 instead of FP32, 768 floats where
the model gives 1536, NaNs, another package's numbers. Used as they come,
such answers would be spread over the batch's tiles or mix two packages'
features in one slide, and the slide would be written as done.

One check family, :class:`AnswerCheck`, for tile, tissue and slide-head
answers; checks compose (:class:`AllOf`): the client always applies its own
(:meth:`AnswerCheck.for_request`, with the run's :class:`PackagePin`) and a
caller's check is added to it, never in its place. What one holds an answer to:

- exactly the outputs asked for (``embedding`` -> ``embedding``;
  ``prediction`` -> ``prediction``; ``prediction_with_embedding`` -> both; a
  tissue model -> ``mask``; a slide head -> what its mode names), none missing
  and no other;
- each output's shape: a tile model's ``n`` rows (the request's tiles) and the
  trailing shape the config lists; a slide head's shapes in terms of ``n``
  (:data:`ROWS`: ``attention [n]`` or ``[n, C]``, ``prediction [C]``);
- the datatype the config lists; only finite values in float outputs;
- when the answer names its model (V2's ``model_name``), the model asked;
- its package (``parameters.package_sha256``, which every histoserve answer
  carries), held by the client's :class:`PackagePin`: the digest the
  config reported at the start of the run, or, where the server reported
  none, the first answer's. So a package swapped behind one URL mid-run, or
  replicas of two packages behind one Service mid-upgrade, never mix two
  packages' features in one slide, whatever check a caller passes. When a
  digest was reported, an answer naming none is refused too;
- for a request of the slide's own JPEG tiles, where they were decoded
  (``parameters.jpeg_decode``): ``cpu`` for ``--transport jpeg``, ``device``
  for ``jpeg-device`` (:meth:`AnswerCheck.decoded_by`); missing or other is
  refused, so device-decoded features never land in a CPU cohort, nor the
  reverse. Pixel requests are not checked for it.

Anything else raises :class:`~histoserve.errors.BadAnswer`, a
:class:`~histoserve.errors.RetryableError`: the dispatcher treats it as a
failed attempt, exactly like a 503 (retried, preferably on another URL), and
when attempts run out the slide fails with the URL and what was wrong. A
wrong answer is never written. Answers are
:class:`~histoserve.remote.transport.Answer`: their outputs and ``identity``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from histoserve import wire
from histoserve.errors import BadAnswer
from histoserve.remote.transport import Answer, answer_bound
from histoserve.slides.tiff.wire_tiles import DECODED_ON

if TYPE_CHECKING:
    from histoserve.remote.served_model import ServerInfo

MODE_OUTPUTS = wire.MODE_OUTPUTS
"""The outputs each mode asks for (declared once, in :mod:`histoserve.wire.modes`)."""
TISSUE_OUTPUTS = wire.MASK_OUTPUTS
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})
ROWS = -2
"""In an expected shape: the request's rows (its tiles)."""
ANY = -1
"""In an expected shape: any size."""
DIGEST_CHARS = 16
"""Hex digits of a package digest quoted in messages."""
Shape = tuple[int, ...]


class Check(Protocol):
    """What an answer must be: an :class:`AnswerCheck`, or several (:class:`AllOf`)."""

    def verify(self, answer: Answer, n_tiles: int, url: str) -> None:
        """Returns when ``answer`` fits; raises a :class:`BadAnswer` when it does not."""
        ...

    def max_answer_bytes(self, n_tiles: int) -> int:
        """The most bytes an answer to ``n_tiles`` rows can need; larger ones are not read."""
        ...


@dataclass(frozen=True)
class Expected:
    """One output an answer must carry.

    Attributes:
        name: Output name.
        datatype: V2 datatype (``FP32``, ``UINT8``, ...); None: not known, not checked.
        shapes: The shapes it may have (:data:`ROWS`: the request's rows,
            :data:`ANY`: any size); empty: not known, only its rows are checked.
    """

    name: str
    datatype: str | None = None
    shapes: tuple[Shape, ...] = ()

    @classmethod
    def per_row(cls, name: str, datatype: str | None, shape: Sequence[int] | None) -> Expected:
        """An output of one row per tile, ``shape`` as a config lists it (the batch axis first)."""
        if shape is None:
            return cls(name, datatype)
        return cls(name, datatype, ((ROWS, *(int(d) for d in shape[1:])),))


class PackagePin:
    """The one package every answer of a run must name (thread-safe).

    Args:
        reported: The digest the model's config reported ("": none; then the
            first answer naming one pins it).
    """

    def __init__(self, reported: str = ""):
        self.reported = reported
        self._first: str | None = None  # the first answer's digest ("": it named none)
        self._lock = threading.Lock()

    @property
    def digest(self) -> str:
        """The pinned digest ("" until one is known)."""
        with self._lock:
            return self.reported or self._first or ""

    def problem(self, digest: object) -> str | None:
        """What is wrong with an answer naming ``digest`` (None: nothing).

        Without a reported digest the first answer pins the run, naming a
        package or naming none: an answer of a package after answers of none
        (or the reverse) is refused as one of another package would be.
        """
        if self.reported:
            want = self.reported[:DIGEST_CHARS]
            if not digest:
                return (
                    f"answered without naming its package (no parameters.package_sha256), "
                    f"though its config reported package {want} at the start of the run: not "
                    "used (a histoserve server names its package in every answer)"
                )
            if str(digest) != self.reported:
                return (
                    f"answered with package {str(digest)[:DIGEST_CHARS]}, not {want} that its "
                    "config reported at the start of the run (the package behind this URL "
                    "changed mid-run, or replicas of two packages serve it)"
                )
            return None
        named = str(digest) if digest else ""
        with self._lock:
            if self._first is None:
                self._first = named
            first = self._first
        if named == first:
            return None
        if not first:
            return (
                f"answered with package {named[:DIGEST_CHARS]}, though the run's first answer "
                "named no package (replicas of two servers serve it): not used"
            )
        if not named:
            return (
                f"answered without naming its package, though the run's first answer named "
                f"{first[:DIGEST_CHARS]} (replicas of two servers serve it): not used"
            )
        return (
            f"answered with package {named[:DIGEST_CHARS]}, not {first[:DIGEST_CHARS]} "
            "that the run's first answer named (replicas of two packages serve it)"
        )


@dataclass(frozen=True)
class AnswerCheck:
    """What every answer of one request kind must be (see the module docstring).

    Attributes:
        outputs: The outputs asked for, each with its datatype and shapes;
            None: not checked here (another check of the same request does).
        mode: What asked for them, for messages (``mode 'embedding'``, ``the tissue model``).
        model: The model asked ("": not checked): an answer naming another fails.
        pin: The run's package (None: not checked here).
        jpeg_decode: Where the request's JPEG tiles must have been decoded
            (``cpu``, ``device``; "": a pixel request, not checked).
    """

    outputs: tuple[Expected, ...] | None = None
    mode: str = ""
    model: str = ""
    pin: PackagePin | None = None
    jpeg_decode: str = ""

    @classmethod
    def for_mode(cls, info: ServerInfo, mode: str, pin: PackagePin | None = None) -> AnswerCheck:
        """The check for ``mode`` requests to the tile model ``info`` describes."""
        expected = _expected(info, MODE_OUTPUTS[mode])
        return cls(expected, f"mode {mode!r}", info.model, _pin(info, pin))

    @classmethod
    def for_request(
        cls, info: ServerInfo, mode: str | None, pin: PackagePin | None = None
    ) -> AnswerCheck:
        """The client's own check of a request of ``mode`` (None: the model's default) to
        the model ``info`` describes, read off what its config declares: a model
        answering ``mask`` is a tissue model (:meth:`for_tissue`); a slide head (it
        takes ``features``) is held to its identity here, its outputs by the
        caller's check (:func:`~histoserve.heads.head.head_check`); any other
        answers the outputs its mode asks.

        A mode the client does not know (the server refuses it, or answers what it
        pleases) must answer the outputs the config lists, each with one row per tile.
        """
        pin = _pin(info, pin)
        if info.takes_features:
            return cls(None, f"slide model {info.model!r}", info.model, pin)
        if info.answers_masks:
            return cls.for_tissue(info, pin)
        mode = mode or (info.modes[0] if info.modes else "embedding")
        if mode in MODE_OUTPUTS:
            return cls.for_mode(info, mode, pin)
        listed = _expected(info, tuple(info.outputs))
        return cls(listed, f"mode {mode!r}", info.model, pin)

    @classmethod
    def for_tissue(cls, info: ServerInfo, pin: PackagePin | None = None) -> AnswerCheck:
        """The check for requests to a tissue-segmentation model (``mask``)."""
        expected = _expected(info, TISSUE_OUTPUTS)
        return cls(expected, f"tissue model {info.model!r}", info.model, _pin(info, pin))

    @classmethod
    def decoded_by(cls, transport: str) -> AnswerCheck:
        """Only where requests sent by ``transport`` (``pixels``, ``jpeg``, ``jpeg-device``)
        must have had their JPEG tiles decoded."""
        return cls(jpeg_decode=DECODED_ON.get(transport, ""))

    def for_transport(self, transport: str) -> AnswerCheck:
        """This check for requests sent by ``transport`` (``pixels``, ``jpeg``, ``jpeg-device``)."""
        return replace(self, jpeg_decode=DECODED_ON.get(transport, ""))

    def max_answer_bytes(self, n_tiles: int) -> int:
        """The most bytes an answer to ``n_tiles`` tiles can need (larger ones are not read)."""
        if self.outputs is None:
            return answer_bound(n_tiles, None)
        values = 0
        for expected in self.outputs:
            if not expected.shapes:
                return answer_bound(n_tiles, None)
            sizes = [_elements(shape, n_tiles) for shape in expected.shapes]
            if any(size is None for size in sizes):
                return answer_bound(n_tiles, None)
            values += max(size for size in sizes if size is not None)
        return answer_bound(1, values)

    def verify(self, answer: Answer, n_tiles: int, url: str) -> None:
        """Returns when ``answer`` fits a request of ``n_tiles`` tiles.

        Raises:
            BadAnswer: ``"<url>: <what was wrong>"``.
        """
        problem = self.problem(answer, n_tiles)
        if problem is not None:
            raise BadAnswer(f"{url}: {problem} (a wrong answer, not used)")

    def problem(self, answer: Answer, n_tiles: int) -> str | None:
        """What is wrong with ``answer`` to ``n_tiles`` tiles, or None."""
        problem = self._identity_problem(answer.identity)
        if problem is not None or self.outputs is None:
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
        name = identity.get("model_name")
        if self.model and name and str(name) != self.model:
            return (
                f"answered as model {str(name)[:80]!r}, not {self.model!r} (another model there?)"
            )
        parameters = identity.get("parameters")
        parameters = parameters if isinstance(parameters, Mapping) else {}
        decoded = parameters.get("jpeg_decode")
        if self.jpeg_decode and str(decoded) != self.jpeg_decode:
            said = f"on {str(decoded)[:40]!r}" if decoded else "without saying where"
            flag = "jpeg-device" if self.jpeg_decode == "device" else "jpeg or auto"
            return (
                f"decoded the request's JPEG tiles {said} (parameters.jpeg_decode), not on "
                f"{self.jpeg_decode!r} as --transport {flag} asks: not used (device-decoded "
                "tiles give other features than the CPU's; a cohort never mixes them)"
            )
        if self.pin is None:
            return None
        return self.pin.problem(parameters.get("package_sha256"))


@dataclass(frozen=True)
class AllOf:
    """Every one of ``checks``: an answer fits when it fits each; bounded by the tightest."""

    checks: tuple[Check, ...]

    def verify(self, answer: Answer, n_tiles: int, url: str) -> None:
        for check in self.checks:
            check.verify(answer, n_tiles, url)

    def max_answer_bytes(self, n_tiles: int) -> int:
        return min(check.max_answer_bytes(n_tiles) for check in self.checks)


@dataclass(frozen=True)
class Capped:
    """No answer larger than ``cap`` bytes (a caller's ``max_answer_bytes``)."""

    cap: int

    def verify(self, answer: Answer, n_tiles: int, url: str) -> None:
        return None

    def max_answer_bytes(self, n_tiles: int) -> int:
        return self.cap


def _pin(info: ServerInfo, pin: PackagePin | None) -> PackagePin:
    return pin if pin is not None else PackagePin(info.reported_sha256)


def _expected(info: ServerInfo, names: tuple[str, ...]) -> tuple[Expected, ...]:
    out = []
    for name in names:
        datatype, shape = info.outputs.get(name, (None, None))
        out.append(Expected.per_row(name, datatype, shape))
    return tuple(out)


def _elements(shape: Shape, n_tiles: int) -> int | None:
    dims = [max(n_tiles, 1) if d == ROWS else d for d in shape]
    if any(d < 0 for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64))


def _output_problem(expected: Expected, values: Any, n_tiles: int) -> str | None:
    name = expected.name
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        return f"{name!r} is not an array"
    try:
        datatype = wire.datatype_of(values)
    except ValueError:
        datatype = str(values.dtype)
    if not expected.shapes or all(s[:1] == (ROWS,) for s in expected.shapes):
        rows = values.shape[0]
        if rows != n_tiles:
            return f"answered {rows} row{'s' * (rows != 1)} for {n_tiles} tiles (output {name!r})"
    if expected.datatype is not None and datatype != expected.datatype:
        return f"{name} is {datatype}, expected {expected.datatype}"
    if expected.shapes:
        wants = [tuple(n_tiles if d == ROWS else d for d in s) for s in expected.shapes]
        if not any(_fits(want, values.shape) for want in wants):
            shown = " or ".join(str(list(w)) for w in wants)
            return f"{name} has shape {list(values.shape)}, expected {shown}"
    if datatype in _FLOATS:
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        if bad:
            return f"{name} has {bad} non-finite value{'s' * (bad != 1)} (NaN or infinity)"
    return None


def _fits(want: Shape, got: Shape) -> bool:
    return len(want) == len(got) and all(w in (ANY, g) for w, g in zip(want, got, strict=True))
