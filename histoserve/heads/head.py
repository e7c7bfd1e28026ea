"""A served slide head (the ``slide`` family): what it takes and answers, and every answer checked.

The contract (issue 25): one V2 request per slide, input ``features`` ``FP32``
``[N, D]`` (FP16 accepted) and optional ``coords`` ``INT64 [N, 2]``; outputs
``prediction`` ``FP32 [C]`` (class names in the spec), ``attention`` ``FP32
[N]`` or ``[N, C]``, ``slide_embedding`` ``FP32 [E]``.

:func:`head_info` reads the head off its client's description (the model's
config over HTTP or gRPC, described once; every URL must report the same
package digest). From the spec it
reads the class names (``classes`` or ``class_names``), the feature width
(``feature_dim``, ``input_dim``, ``embedding_dim`` of its ``tile_encoder``, or
the listed ``features`` input) and the modes; the outputs as the config lists
them. The mode asked is every mode of a slide spec joined with commas
(``prediction,embedding,attention``: one forward answers them all), else the
spec's mode that names the most of them (``all`` names all); the outputs
expected are those the mode names (every listed one for ``all`` or no mode).

:func:`head_check` holds an answer to one slide of N tiles to that, in the
client's one check family (:class:`~histoserve.remote.answers.AnswerCheck`):
exactly the expected outputs, ``prediction`` ``[C]``, ``attention`` ``[N]``
or ``[N, C]``, ``slide_embedding`` ``[E]`` (E as listed), FP32 (any listed
datatype), finite; the client adds its own check of the model and package
every answer names. Anything else is a :class:`~histoserve.errors.BadAnswer`:
retried elsewhere like a 503, never written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from histoserve.errors import EmbedError, UsageError
from histoserve.remote.answers import ANY, ROWS, AnswerCheck, Expected
from histoserve.remote.client import HistoserveClient
from histoserve.wire import SLIDE_INPUT, SLIDE_MODE_OUTPUTS, SLIDE_OUTPUTS

_MODE_WORDS = {mode: outputs[0] for mode, outputs in SLIDE_MODE_OUTPUTS.items()}


@dataclass(frozen=True)
class HeadInfo:
    """A served slide head as the client needs it.

    Attributes:
        model: Model name in URLs.
        package_sha256: The package digest the server reports ("" when none).
        classes: Class names, in the order of ``prediction``.
        feature_dim: D the head takes (0: not said).
        mode: The mode asked (None: the model's default).
        outputs: Expected outputs: name -> (datatype, shape as listed).
        spec: The spec as reported.
        max_tiles: The most tiles the server takes in one slide (0: not said).
        encoder_sha256: The package digest of the tile encoder whose features
            the head takes, when the server says it ("" when not).
        encoder_name: That tile encoder's spec name, when the server says it ("" when not).
    """

    model: str
    package_sha256: str
    classes: tuple[str, ...]
    feature_dim: int
    mode: str | None
    outputs: Mapping[str, tuple[str, tuple[int, ...]]]
    spec: Mapping[str, Any] = field(default_factory=dict)
    max_tiles: int = 0
    encoder_sha256: str = ""
    encoder_name: str = ""


def head_info(client: HistoserveClient) -> HeadInfo:
    """The head ``client``'s servers describe (every URL the same package, :attr:`~HistoserveClient.info`).

    Raises:
        UsageError: No such model, not a slide model, URLs disagreeing.
        RemoteError: A server cannot be reached or answers something unexpected.
    """
    info = client.info
    return head_from_config(info.model, client.config())


def head_from_config(model: str, config: Mapping[str, Any]) -> HeadInfo:
    """:class:`HeadInfo` from a config answer (UsageError: not a slide model)."""
    try:
        spec = dict(config.get("spec") or {})
        listed = {
            str(o["name"]): (str(o["datatype"]), tuple(int(d) for d in o["shape"]))
            for o in config.get("outputs") or ()
        }
        inputs = {str(i["name"]): i for i in config.get("inputs") or ()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EmbedError(f"model {model!r}: unexpected config answer ({exc!r})") from exc
    family = spec.get("family")
    declared = SLIDE_INPUT in inputs or "attention" in listed
    if not declared and (inputs or family != "slide"):  # no inputs listed: its spec says
        raise UsageError(
            f"model {model!r} is a {family or 'non-slide'} model, not a slide head "
            "(family 'slide'): aggregate and --slide-model take a slide model"
        )
    modes = [str(m) for m in spec.get("modes") or ()]
    mode, wanted = choose_mode(modes, listed)
    dim = spec.get("embedding_dim")
    default_e = (int(dim),) if isinstance(dim, int) and dim > 0 else ()
    outputs = {
        n: listed.get(n, ("FP32", default_e if n == "slide_embedding" else ())) for n in wanted
    }
    names = spec.get("classes") or spec.get("class_names") or config.get("classes") or ()
    classes = tuple(str(c) for c in names)
    encoder = config.get("tile_encoder") or spec.get("tile_encoder")
    encoder_sha = encoder.get("package_sha256") if isinstance(encoder, Mapping) else None
    encoder_name = encoder.get("name") if isinstance(encoder, Mapping) else encoder
    limit = config.get("max_tiles_per_slide")
    return HeadInfo(
        model=model,
        package_sha256=str(config.get("package_sha256") or config.get("sha256") or ""),
        classes=classes,
        feature_dim=_feature_dim(spec, inputs),
        mode=mode,
        outputs=outputs,
        spec=spec,
        max_tiles=limit if isinstance(limit, int) and limit > 0 else 0,
        encoder_sha256=str(encoder_sha or spec.get("tile_encoder_sha256") or ""),
        encoder_name=encoder_name if isinstance(encoder_name, str) else "",
    )


def choose_mode(
    modes: Sequence[str], listed: Mapping[str, Any]
) -> tuple[str | None, tuple[str, ...]]:
    """The mode to ask and the outputs it names (see the module docstring).

    A slide spec's modes (``prediction``, ``embedding``, ``attention``) are
    joined with commas, as the slide family takes several from one forward.
    """
    everything = tuple(n for n in SLIDE_OUTPUTS if n in listed) or SLIDE_OUTPUTS
    if not modes:
        return None, everything
    if all(m in _MODE_WORDS for m in modes):
        return ",".join(modes), tuple(_MODE_WORDS[m] for m in modes)
    if "all" in modes:
        return "all", everything
    best = max(modes, key=lambda m: (len(mode_outputs(m)), -modes.index(m)))
    named = mode_outputs(best)
    return best, named or everything


def mode_outputs(mode: str) -> tuple[str, ...]:
    """The slide outputs a mode's name names (``prediction_with_attention``: two)."""
    words = set(re.split(r"[^a-z]+", mode.lower()))
    return tuple(out for word, out in _MODE_WORDS.items() if word in words)


def _feature_dim(spec: Mapping[str, Any], inputs: Mapping[str, Any]) -> int:
    encoder = spec.get("tile_encoder")
    candidates = [spec.get(k) for k in ("feature_dim", "input_dim", "features_dim")]
    if isinstance(encoder, Mapping):
        candidates += [encoder.get(k) for k in ("feature_dim", "embedding_dim", "dim", "width")]
    if "features" in inputs:
        shape = inputs["features"].get("shape") or ()
        candidates.append(shape[-1] if len(shape) == 2 else None)
    for value in candidates:
        if isinstance(value, int) and value > 0:
            return value
    return 0


def head_check(info: HeadInfo) -> AnswerCheck:
    """What an answer to one slide must be (see the module docstring), N the slide's tiles."""
    classes = len(info.classes) or ANY
    shapes = {
        "attention": ((ROWS,), (ROWS, classes)),
        "prediction": ((classes,),),
    }
    outputs = tuple(
        Expected(
            name,
            datatype,
            shapes.get(name, ((listed[-1] if listed else ANY,),)),
        )
        for name, (datatype, listed) in info.outputs.items()
    )
    return AnswerCheck(outputs, f"slide model {info.model!r}")
