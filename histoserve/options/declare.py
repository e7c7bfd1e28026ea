"""How an option of ``histoserve embed`` is declared: one dataclass field with its metadata.

A field made with :func:`option` is, at once, the command line's flag, the
keyword argument of :func:`histoserve.embed`, its kind (the type the API
checks and the command line converts to), its default (the field's own) and
its help. :func:`declared` reads them back; the parser
(:mod:`histoserve.commands.embed`) and the API's keyword check
(:mod:`histoserve.api`) are generated from them, so nothing is written twice.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Where an option is shown in ``--help``, in this order.
GROUPS = ("input and output", "servers", "tiles and tissue", "requests")
# What each kind of option takes: the API's check and what the message says it expects.
IS_KIND: dict[str, Callable[[Any], bool]] = {
    "path": lambda v: isinstance(v, (str, os.PathLike)),
    "text": lambda v: isinstance(v, str),
    "flag": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "whole number": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
}
# Kinds with a conversion of their own (histoserve.api): one value or several,
# slide paths, a shard given as text or as a pair.
SPECIAL_KINDS = ("several", "paths", "shard")
_OPTION = "histoserve.option"


@dataclass(frozen=True)
class Option:
    """One option, read back from its field by :func:`declared`.

    Attributes:
        help: The ``--help`` line (the default is appended unless it says its own).
        kind: A key of :data:`IS_KIND` or one of :data:`SPECIAL_KINDS`.
        group: Where ``--help`` shows it (one of :data:`GROUPS`).
        keyword: The API's keyword argument; "" in a declaration: the field's name.
        flag: The command line's flag; "": ``--`` and the keyword, ``_`` as ``-``.
        choices: The values the command line accepts (the config checks them too).
        metavar: How ``--help`` names the value.
        hidden: Left out of ``--help`` (the flag still works).
        field: The dataclass field it sets (filled in by :func:`declared`).
        default: The field's default (filled in by :func:`declared`).
        required: Whether the field has no default: the keyword and the flag must be given.
    """

    help: str
    kind: str
    group: str
    keyword: str = ""
    flag: str = ""
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    hidden: bool = False
    field: str = ""
    default: Any = None
    required: bool = False


def option(
    default: Any = dataclasses.MISSING, *, help: str, kind: str, group: str, **more: Any
) -> Any:
    """A dataclass field that is also an option (see :class:`Option` for ``more``)."""
    assert kind in IS_KIND or kind in SPECIAL_KINDS, kind
    assert group in GROUPS, group
    declaration = Option(help=help, kind=kind, group=group, **more)
    return dataclasses.field(default=default, metadata={_OPTION: declaration})


def declared(*classes: type) -> tuple[Option, ...]:
    """The options declared on ``classes``' fields, in field order, complete."""
    found = []
    for cls in classes:
        for f in dataclasses.fields(cls):
            if _OPTION in f.metadata:
                declaration = f.metadata[_OPTION]
                keyword = declaration.keyword or f.name
                found.append(
                    dataclasses.replace(
                        declaration,
                        keyword=keyword,
                        flag=declaration.flag or "--" + keyword.replace("_", "-"),
                        field=f.name,
                        default=None if f.default is dataclasses.MISSING else f.default,
                        required=f.default is dataclasses.MISSING,
                    )
                )
    return tuple(found)
