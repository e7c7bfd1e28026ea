"""What the server says about its model: tile size, mpp, outputs, package identity.

``histoserve embed`` tiles slides at the model's own scale, so before reading
a single tile its client describes the model (:func:`describe`, through the
client's one ``send``, :mod:`~histoserve.remote.request`): the served models
(``GET /v1/models``; gRPC ``RepositoryIndex``) for the model name when none
is given and one is served, then the model's config (``GET
/v2/models/{name}/config``; gRPC ``ModelConfig``, the same keys as its
parameters): the spec (``tile_size``, ``mpp``, ``family``, modes), the
package's digest and metadata and, for multimodal models, the input gene
list. The answer goes into every output file (spec, package identity) and
into the config hash that decides resume. So a ``grpc://`` URL describes a
histoserve model as an ``http://`` one does.

A V2 gRPC server that does not answer ``ModelConfig`` (another server than
histoserve's) is described by its ``ModelMetadata``: tile size, gene count and
outputs, no mpp and no package digest; what the run then cannot know is
named (``--target-mpp``), and every answer's package is pinned to the first
one's (:class:`~histoserve.remote.answers.PackagePin`).

Every URL is asked, not only the first: requests go to all of them, so a
second URL serving another package (same shapes, other weights) would put
its features into the same files. Every URL's config must report the first
one's package digest and spec; a URL described by metadata alone gives no
digest, so only its tile size, gene count and output names, datatypes and
shapes are compared (:func:`check_same_model`). Any difference is a usage
error naming both URLs and what differs, before any slide is read. Where
they decode JPEG tiles (``jpeg_decode``) may differ: pixels are the same
either way, so such URLs are described as ``mixed`` and no jpeg transport is
chosen for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from histoserve import wire
from histoserve.errors import (
    HistoserveError,
    InferenceError,
    RemoteError,
    RequestFailed,
    UsageError,
)
from histoserve.limits import MAX_READ_PX, mpp_problem
from histoserve.remote.request import MAX_CONFIG_BYTES, Request

GRPC_DIGEST = "grpc-metadata:"
"""How :attr:`ServerInfo.package_sha256` starts when it comes from gRPC metadata (no digest)."""
METADATA_DIGEST = "metadata:"
"""How it starts when made up from a config that reports no digest."""
NOT_FOUND = frozenset({404, "NOT_FOUND"})
UNIMPLEMENTED = frozenset({404, "UNIMPLEMENTED"})
"""What a server that does not know a describing call answers (gRPC; REST: a 404 route)."""

OutputInfo = tuple[str, tuple[int, ...]]
"""An output's V2 datatype and shape (``-1`` where any size goes: the batch axis)."""
Send = Callable[[str, Request], Any]
"""``(url, request) -> answer``: the client's one send, to one URL, retried by its one loop."""


@dataclass(frozen=True)
class ServerInfo:
    """One served model as the embed client needs it.

    Attributes:
        model: Model name in URLs.
        family: ``embedding``, ``multimodal`` or ``segmentation``, as the spec says
            (recorded, shown; the client branches on the declared outputs instead).
        tile_size: Tile edge the model takes (px).
        mpp: Microns per pixel the model was trained at (None: unknown, gRPC only).
        modes: Modes the model answers; the first is its default.
        n_genes: Bulk-RNA vector length for multimodal models (0: takes none).
        package_sha256: The package digest when the server reports one, else a
            digest of the package metadata it reports (provenance, spec, build facts).
        spec: The spec as the server reports it (JSON-ready).
        outputs: Output name -> :data:`OutputInfo`, as the server lists them
            (``outputs`` of the config, or gRPC metadata), else as the spec implies.
            Every answer is checked against these (:mod:`~histoserve.remote.answers`).
        transports: How the server takes tiles: ``pixels``, and ``jpeg`` when it
            decodes the slide's own JPEG tiles (config ``transports``, or a
            ``jpeg_tiles`` input in gRPC metadata).
        jpeg_decode: Where it decodes them: ``cpu`` (config ``jpeg_decode``, or
            none: a server before the field decodes on the CPU), ``device``;
            ``mixed`` when two URLs' configs differ; ``""``: unknown (gRPC
            metadata). Which ``--transport`` may use them
            (:func:`~histoserve.slides.tiff.wire_tiles.choose_transport`).
        inputs: The input names the server lists (config ``inputs`` or gRPC
            metadata; empty when it lists none).
    """

    model: str
    family: str
    tile_size: int
    mpp: float | None
    modes: tuple[str, ...]
    n_genes: int = 0
    package_sha256: str = ""
    spec: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, OutputInfo] = field(default_factory=dict)
    transports: tuple[str, ...] = ("pixels",)
    jpeg_decode: str = ""
    inputs: tuple[str, ...] = ()

    @property
    def reported_sha256(self) -> str:
        """The package digest as the server reported it; "" when made up here from metadata."""
        made_up = self.package_sha256.startswith((GRPC_DIGEST, METADATA_DIGEST))
        return "" if made_up else self.package_sha256

    @property
    def takes_features(self) -> bool:
        """Whether it is a slide head: its inputs list ``features`` (:data:`~histoserve.wire.SLIDE_INPUT`)."""
        return wire.SLIDE_INPUT in self.inputs

    @property
    def answers_masks(self) -> bool:
        """Whether it is a tissue model: its outputs list a ``mask`` (:data:`~histoserve.wire.MASK_OUTPUTS`)."""
        return any(name in self.outputs for name in wire.MASK_OUTPUTS)

    def check_mode(self, mode: str) -> None:
        """UsageError when the model cannot answer ``mode`` (e.g. a segmentation model)."""
        if self.answers_masks:
            raise UsageError(
                f"model {self.model!r} is a segmentation model: use it with --tissue {self.model}"
            )
        if mode not in self.modes:
            raise UsageError(
                f"model {self.model!r} has no mode {mode!r}; it answers {', '.join(self.modes)}"
            )


def info_url(urls: Sequence[str]) -> str | None:
    """The first HTTP(S) URL: the one that has the config endpoint."""
    return next((u for u in urls if u.startswith(("http://", "https://"))), None)


def describe(
    urls: Sequence[str], model: str | None, send: Send, besides: Collection[str] = ()
) -> tuple[ServerInfo, dict[str, Any]]:
    """The model's :class:`ServerInfo` and its config as the first URL reports it.

    The first HTTP(S) URL is asked first (else the first); every other URL is
    asked too and must serve the same model package (:func:`check_same_model`).
    ``send`` is the client's one send (its retries: a Job's pod may start
    before its InferenceService is ready, or while it scales up). With no
    ``model``, the one model the first URL serves other than ``besides`` (the
    models the run uses for something else: its tissue model, its slide head,
    served by the same server) is described.

    Raises:
        UsageError: No model named and the server serves several (or none), an
            unknown model, or two URLs serving different packages.
        RemoteError: A server cannot be reached or answers something unexpected.
    """
    urls = list(dict.fromkeys(urls))
    first = info_url(urls) or urls[0]
    reference, config = _ask(send, first, model, frozenset(besides))
    others = [(u, _ask_another(send, u, reference.model, first)) for u in urls if u != first]
    check_same_model([(first, reference), *others])
    decodes = {i.jpeg_decode for _, i in others if i.jpeg_decode} - {reference.jpeg_decode}
    if decodes:
        reference = dataclasses.replace(reference, jpeg_decode="mixed")
    return reference, config


def _ask(
    send: Send, url: str, name: str | None, besides: frozenset[str] = frozenset()
) -> tuple[ServerInfo, dict[str, Any]]:
    """One URL's description: its config, or its V2 metadata where it has no config call."""
    try:
        return _described(send, url, name, besides)
    except RequestFailed as exc:
        if isinstance(exc, InferenceError):  # it answered: its refusal says why
            raise
        raise RemoteError(f"cannot reach {url} to describe the model: {exc}") from exc


def _described(
    send: Send, url: str, name: str | None, besides: frozenset[str]
) -> tuple[ServerInfo, dict[str, Any]]:
    name = name or _only_model(send, url, besides)
    try:
        config = send(url, Request("config", name, max_answer_bytes=MAX_CONFIG_BYTES))
    except InferenceError as exc:
        if exc.status in NOT_FOUND and not url.startswith(("grpc://", "grpcs://")):
            raise UsageError(f"{url} serves no model {name!r}: {exc}") from exc
        if exc.status not in UNIMPLEMENTED and exc.status not in NOT_FOUND:
            raise
        info = _from_metadata(send, url, name, exc)
        check_served_numbers(url, info)
        return info, {}
    info = info_from_config(name, config)
    check_served_numbers(url, info)
    return info, config


def _from_metadata(send: Send, url: str, name: str, why: InferenceError) -> ServerInfo:
    """A gRPC URL without ``ModelConfig``: its ``ModelMetadata`` (no mpp, no digest)."""
    try:
        meta = send(url, Request("metadata", name, max_answer_bytes=MAX_CONFIG_BYTES))
    except InferenceError as exc:
        if exc.status in NOT_FOUND:
            raise UsageError(f"{url} serves no model {name!r}: {exc}") from exc
        raise
    try:
        inputs, outputs = (_entries(meta.get(key)) for key in ("inputs", "outputs"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RemoteError(
            f"{url}: model metadata of {name!r}: unexpected answer ({exc!r})"
        ) from exc
    del why  # its ModelConfig call is not implemented there: metadata is all it says
    return info_from_metadata(url, name, inputs, outputs)


def _entries(listed: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": str(t["name"]),
            "datatype": str(t["datatype"]),
            "shape": [int(d) for d in t["shape"]],
        }
        for t in listed or ()
    ]


def _only_model(send: Send, url: str, besides: frozenset[str]) -> str:
    """The one model ``url`` serves but ``besides``; UsageError naming them when several or none."""
    try:
        models = send(url, Request("models"))
    except InferenceError as exc:
        if exc.status in UNIMPLEMENTED:
            raise UsageError(
                f"{url} does not list its models ({exc.status}): pass --model NAME"
            ) from exc
        raise
    left = [str(m) for m in models if str(m) not in besides]
    if len(left) != 1:
        others = f" besides {', '.join(sorted(besides))}" if besides else ""
        raise UsageError(
            f"{url} serves {len(left)} models{others} ({', '.join(left) or 'none'}): "
            "pick one with --model"
        )
    return left[0]


def _ask_another(send: Send, url: str, name: str, first: str) -> ServerInfo:
    """:func:`_ask` for a URL beside the first; an unreachable one says why it was asked."""
    try:
        return _ask(send, url, name)[0]
    except UsageError:
        raise
    except HistoserveError as exc:
        raise RemoteError(
            f"{exc}; every --url is asked before any slide whether it serves the same "
            f"model package as {first}: drop this one, or run again when it is up"
        ) from exc


def check_same_model(infos: Sequence[tuple[str, ServerInfo]]) -> None:
    """UsageError unless every ``(url, info)`` describes the first one's model package.

    Two configs (HTTP) must agree on the package digest and the spec. Where
    one side is gRPC metadata (no digest, no spec), the tile size, the gene
    count and the outputs (names, datatypes, shapes; ``-1`` matches any size)
    must agree: that is all gRPC can tell.
    """
    (first_url, first), *others = infos
    for url, info in others:
        problem = _difference(first, info)
        if problem is not None:
            raise UsageError(
                f"--url {first_url} and --url {url} serve different models: {problem}. Every "
                "--url must serve the same model package (an upgrade under way? wait until "
                "every server runs one package, or give only the URLs of one)"
            )


def _difference(a: ServerInfo, b: ServerInfo) -> str | None:
    """How two servers' model descriptions differ, or None."""
    grpc = [i.package_sha256.startswith(GRPC_DIGEST) for i in (a, b)]
    if not any(grpc):
        if a.package_sha256 != b.package_sha256:
            return f"package {a.package_sha256} vs package {b.package_sha256}"
        keys = sorted(k for k in {*a.spec, *b.spec} if a.spec.get(k) != b.spec.get(k))
        if keys:
            return f"one package {a.package_sha256}, but specs differing in {', '.join(keys)}"
        return None
    digests = " vs ".join(
        "gRPC metadata (no package digest: only shapes compared)" if g else i.package_sha256
        for g, i in zip(grpc, (a, b), strict=True)
    )
    for what, x, y in (
        ("tile size", a.tile_size, b.tile_size),
        ("gene count", a.n_genes, b.n_genes),
        ("outputs", sorted(a.outputs), sorted(b.outputs)),
    ):
        if x != y:
            return f"{what} {x} vs {y} ({digests})"
    for name, (dtype, shape) in a.outputs.items():
        other_dtype, other_shape = b.outputs[name]
        fits = len(shape) == len(other_shape) and all(
            -1 in (d, e) or d == e for d, e in zip(shape, other_shape, strict=True)
        )
        if dtype != other_dtype or not fits:
            return (
                f"output {name!r} {dtype} {list(shape)} vs {other_dtype} "
                f"{list(other_shape)} ({digests})"
            )
    return None


def info_from_config(name: str, config: Mapping[str, Any]) -> ServerInfo:
    """Builds :class:`ServerInfo` from a ``/v2/models/{name}/config`` answer.

    A slide head (family ``slide``, or a ``features`` input) takes no tiles:
    its tile size (0) and mpp (None) are read only where its spec says them.
    """
    try:
        spec = dict(config["spec"])
        digest = config.get("package_sha256") or config.get("sha256")
        if not digest:
            blob = json.dumps(config.get("package_metadata", {}), sort_keys=True).encode()
            digest = METADATA_DIGEST + hashlib.sha256(blob).hexdigest()
        inputs = tuple(str(i["name"]) for i in config.get("inputs") or ())
        head = spec.get("family") == "slide" or wire.SLIDE_INPUT in inputs
        tile_size = spec.get("tile_size", 0) if head else spec["tile_size"]
        mpp = spec.get("mpp") if head else spec["mpp"]
        return ServerInfo(
            model=name,
            family=str(spec["family"]),
            tile_size=int(tile_size),
            mpp=float(mpp) if mpp is not None else None,
            modes=tuple(spec.get("modes") or ()) if head else tuple(spec["modes"]),
            n_genes=len(config.get("genes_in") or ()),
            package_sha256=str(digest),
            spec=spec,
            outputs=_listed_outputs(config.get("outputs")) or _spec_outputs(spec),
            transports=tuple(str(t) for t in config.get("transports") or ("pixels",)),
            jpeg_decode=str(config.get("jpeg_decode") or "cpu")[:40],
            inputs=inputs,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RemoteError(f"model {name!r}: unexpected config answer ({exc!r})") from exc


MAX_OUTPUT_ELEMENTS = 1 << 24
"""Most values one tile's output may have (a 2048 x 2048 x 4 mask); more is a broken config."""
MAX_GENES = 1_000_000


def check_served_numbers(url: str, info: ServerInfo) -> None:
    """Every number of the served model the run uses, in range, before any slide.

    Raises:
        UsageError: ``"<url>: model 'm' reports <field> <value>: <why>"``, for
            the first number out of range: a tile size outside 1..``MAX_READ_PX``,
            an mpp outside the plausible range (0, NaN and infinity included), a
            gene count or an output shape no model has.
    """
    problems = []
    head = info.family == "slide" or info.takes_features  # takes features, not tiles
    if not (head and info.tile_size == 0) and not 1 <= info.tile_size <= MAX_READ_PX:
        problems.append(("tile_size", info.tile_size, f"outside 1..{MAX_READ_PX} px"))
    if info.mpp is not None:
        problem = mpp_problem(info.mpp)
        if problem is not None:
            problems.append(("mpp", info.mpp, problem))
    if not 0 <= info.n_genes <= MAX_GENES:
        problems.append(("genes_in", info.n_genes, f"more than {MAX_GENES:,} genes"))
    for name, (_, shape) in info.outputs.items():
        trailing = shape[1:]
        if any(d < -1 for d in shape) or any(d == 0 for d in trailing):
            problems.append((f"output {name!r} shape", list(shape), "a size below -1 or of 0"))
        elif int(np.prod([max(d, 1) for d in trailing], dtype=np.float64)) > MAX_OUTPUT_ELEMENTS:
            problems.append(
                (
                    f"output {name!r} shape",
                    list(shape),
                    f"over {MAX_OUTPUT_ELEMENTS:,} values a tile",
                )
            )
    if problems:
        field_name, value, why = problems[0]
        raise UsageError(
            f"{url}: model {info.model!r} reports {field_name} {value!r}: {why}; "
            "the server's config is wrong (check its spec and package)"
        )


def _listed_outputs(listed: Any) -> dict[str, OutputInfo]:
    """``[{"name", "datatype", "shape"}, ...]`` (config or gRPC metadata) as :data:`OutputInfo`."""
    return {
        str(o["name"]): (str(o["datatype"]), tuple(int(d) for d in o["shape"]))
        for o in listed or ()
    }


def _spec_outputs(spec: Mapping[str, Any]) -> dict[str, OutputInfo]:
    """What the contract says a model answers, for a server whose config lists no outputs.

    The one place the client reads a family's name: a server that lists no
    outputs says nothing else (a ``segmentation`` model answers masks, the
    others what their modes ask).
    """
    if spec["family"] == "segmentation":
        size = int(spec["tile_size"])
        return {name: ("UINT8", (-1, size, size)) for name in wire.MASK_OUTPUTS}
    dim = int(spec.get("embedding_dim") or -1)
    modes = [str(m) for m in spec.get("modes") or ("embedding",)]
    names = dict.fromkeys(n for m in modes for n in wire.MODE_OUTPUTS.get(m, ()))
    return {n: ("FP32", (-1, dim if n == "embedding" else -1)) for n in names or ["embedding"]}


def info_from_metadata(
    url: str, name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]
) -> ServerInfo:
    """Builds :class:`ServerInfo` from gRPC ``ModelMetadata`` inputs and outputs."""
    shapes = {i["name"]: i["shape"] for i in inputs}
    if "pixels" not in shapes:
        raise RemoteError(f"{url}: model {name!r} has no 'pixels' input ({sorted(shapes)})")
    out_names = {o["name"] for o in outputs}
    masks = any(name in out_names for name in wire.MASK_OUTPUTS)
    family = "segmentation" if masks else "embedding"
    modes = ("embedding",) if "embedding" in out_names else ()
    if "prediction" in out_names:
        family = "multimodal" if "bulk_rna" in shapes else family
        modes = ("prediction", *(m for m in wire.MODES if m != "prediction"))  # prediction first
    return ServerInfo(
        model=name,
        family=family,
        tile_size=int(shapes["pixels"][1]),
        mpp=None,
        modes=modes,
        n_genes=int(shapes["bulk_rna"][1]) if "bulk_rna" in shapes else 0,
        package_sha256=GRPC_DIGEST + hashlib.sha256(repr(shapes).encode()).hexdigest(),
        spec={"name": name, "family": family, "inputs": inputs, "outputs": outputs},
        outputs=_listed_outputs(outputs),
        transports=("pixels", "jpeg") if "jpeg_tiles" in shapes else ("pixels",),
        inputs=tuple(shapes),
    )
