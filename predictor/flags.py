"""How a server flag is declared: one field of a frozen config with its metadata.

A field made with :func:`flag` is, at once, the flag ``--<field name>`` of
``python -m predictor`` / ``histoserve serve``, its conversion, its default
(the field's own) and its help. :func:`add_flags` makes the parser's
arguments from a config class and :func:`config_from` the config from the
parsed flags, so :mod:`predictor.cli` writes no flag by hand. Flags that
KServe's own parser declares (``--model_name``, the gRPC message limits,
``--enable_latency_logging``) are declared with ``kserve=True``: the field
gives histoserve's default, KServe's parser the flag and its help.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_FLAG = "predictor.flag"


@dataclass(frozen=True)
class Flag:
    """One flag, read back from its field.

    Attributes:
        help: The ``--help`` line; None: the flag is shown without one.
        type: What argparse converts the text to (None: kept as text).
        choices: The values accepted.
        hidden: Left out of ``--help`` (internal: front ends, faults).
        early: Read before anything heavy is imported (see
            :func:`predictor.cli.early_flags`); its type must import nothing.
        kserve: KServe's parser declares the flag; only its default is ours.
    """

    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] = ()
    hidden: bool = False
    early: bool = False
    kserve: bool = False


def flag(default: Any, help: str | None = None, **more: Any) -> Any:
    """A dataclass field that is also a server flag (see :class:`Flag` for ``more``)."""
    return dataclasses.field(default=default, metadata={_FLAG: Flag(help=help, **more)})


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """``(field, flag)`` for each field of ``cls`` that is a flag, in field order."""
    return [(f, f.metadata[_FLAG]) for f in dataclasses.fields(cls) if _FLAG in f.metadata]


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    title: str | None = None,
    only: Callable[[Flag], bool] = lambda _: True,
) -> None:
    """``cls``'s flags as ``parser``'s arguments (in a group named ``title``, if given).

    A KServe flag only gets histoserve's default (``parser`` must already
    have KServe's flags, from its parent parser).
    """
    section = parser.add_argument_group(title) if title else parser
    for f, declaration in declared(cls):
        if not only(declaration):
            continue
        if declaration.kserve:
            parser.set_defaults(**{f.name: f.default})
            continue
        more: dict[str, Any] = {"default": f.default, "help": declaration.help}
        if declaration.hidden:
            more["help"] = argparse.SUPPRESS
        if declaration.type is not None:
            more["type"] = declaration.type
        if declaration.choices:
            more["choices"] = declaration.choices
        section.add_argument(f"--{f.name}", **more)


def config_from(cls: type, args: argparse.Namespace) -> Any:
    """``cls`` made from the parsed flags of its flag fields (other fields: their defaults)."""
    return cls(**{f.name: getattr(args, f.name) for f, _ in declared(cls)})


def true_or_false(value: str) -> bool:
    """``true``/``false`` (and KServe's other spellings) for boolean flags."""
    from predictor.kserve.compat import strtobool

    return strtobool(value)


def auto_or_count(value: str) -> int | None:
    """``auto`` (None: the code decides, see :func:`predictor.device.cpus.resolve_instances`) or a count."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number, got {value!r}"
        ) from None


def ratio(value: str) -> float:
    """A share from 0 to 1 (``--otel_sample_ratio``)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {value!r}")
    return number


def names_list(value: str) -> tuple[str, ...]:
    """Comma-separated names (``--models a,b``), empty parts dropped."""
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {value!r}")
    return names


def per_class(value: str) -> tuple[float, ...]:
    """One number, or comma-separated numbers (one per class of service), as a tuple."""
    try:
        return tuple(float(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or comma-separated numbers, got {value!r}"
        ) from None
