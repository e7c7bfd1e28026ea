"""``histoserve embed``: the command line over :func:`histoserve.api.embed`.

Each flag is the keyword argument of the same name, with the same default,
kind and help: the parser is made from the options' one declaration
(:data:`~histoserve.embedding.config.EMBED_OPTIONS`), so the two cannot drift.

Exit status: 0 when every slide is done or skipped, 1 when some failed (see
``status.csv``), 2 for usage errors (no slides, no ``--out``, a bad
``--shard``, an unknown flag: argparse's own exit 2), found before any slide
is touched, 130 on Ctrl-C.

Ctrl-C ends the process at once, as SIGTERM and SIGKILL do: files are only
ever renamed into place when complete and claims are released by the kernel,
so there is nothing to clean up, and waiting for the slides in progress (what
Python's own interrupt would do, joining their threads) could take minutes.
Re-running the same command resumes.

Everything printed to the terminal (messages, the final line, log lines,
argparse's complaints) goes through
:func:`~histoserve.text.printable`: control characters in slide
ids, paths and server messages are shown escaped, never acted on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from histoserve.embedding.config import EMBED_OPTIONS, EmbedConfig
from histoserve.options.declare import GROUPS, Option
from histoserve.text import printable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# What argparse converts each kind of option's text to (flags and lists: by their action).
_CONVERT = {"path": Path, "paths": Path, "number": float, "whole number": int}


def build_parser() -> argparse.ArgumentParser:
    """The ``histoserve embed`` parser, made from the declared options (README's flags)."""
    parser = _Parser(
        prog="histoserve embed",
        description="Embed whole slides with a histoserve model: one HDF5 file per slide.",
        formatter_class=_DefaultsFormatter,
    )
    for group in GROUPS:
        section = parser.add_argument_group(group)
        for declared in EMBED_OPTIONS:
            if declared.group == group:
                _add(section, declared)
    return parser


def _add(section: argparse._ArgumentGroup, declared: Option) -> None:
    """One option as argparse's argument: its flag, dest (the API keyword), default and help."""
    more: dict[str, Any] = {
        "help": argparse.SUPPRESS if declared.hidden else declared.help,
        "default": declared.default,
    }
    if declared.kind == "paths":
        section.add_argument(declared.keyword, nargs="*", type=Path, **more)
        return
    if declared.kind == "flag":
        more["action"] = "store_false" if declared.default else "store_true"
    elif declared.kind == "several":
        more.update(action="append", default=list(declared.default or ()))
    else:
        more["type"] = _CONVERT.get(declared.kind, str)
    if declared.choices:
        more["choices"] = declared.choices
    if declared.metavar:
        more["metavar"] = declared.metavar
    section.add_argument(declared.flag, dest=declared.keyword, required=declared.required, **more)


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, unless the help says it in its own words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (action.help and "(default:" in action.help) or action.required:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, with the arguments it quotes back escaped (an unknown flag is shown as typed)."""

    def error(self, message: str) -> NoReturn:
        super().error(printable(message))


class _PrintableFormatter(logging.Formatter):
    """Log lines with control characters escaped; a traceback keeps its own line breaks only."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        import traceback

        chunks = traceback.TracebackException(*ei[:3]).format()
        return "".join(_traceback_chunk(chunk) for chunk in chunks).removesuffix("\n")

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep_newlines=True)


def _traceback_chunk(chunk: str) -> str:
    """A header or frame keeps its lines; an exception's message is escaped whole (one line)."""
    if chunk.startswith(("Traceback", "  ", "\n")):
        return printable(chunk, keep_newlines=True)
    return printable(chunk.removesuffix("\n")) + "\n"


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> EmbedConfig:
    """The :class:`~histoserve.embedding.config.EmbedConfig` of parsed flags (UsageError when bad)."""
    from histoserve.api import embed_config

    return embed_config(options_of(args), env)


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """Parsed flags as :func:`histoserve.api.embed`'s keyword arguments (each flag's dest)."""
    return vars(args).copy()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``histoserve embed``; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupted) if in_main_thread else None
    try:
        return _run(args)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    from histoserve.api import embed
    from histoserve.errors import HistoserveError, UsageError

    try:
        summary = embed(**options_of(args), env=os.environ)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except HistoserveError as exc:
        _say(str(exc))
        return EXIT_FAILED
    done, skipped, failed = len(summary.done), len(summary.skipped), len(summary.failed)
    _say(
        f"{done} done, {skipped} skipped, {failed} failed; "
        f"{summary.tiles} tiles in {summary.seconds:.1f} s; status in {args.out / 'status.csv'}"
    )
    return EXIT_FAILED if failed else EXIT_OK


def _say(message: str) -> None:
    print(f"histoserve embed: {printable(message)}", file=sys.stderr)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    print("\nhistoserve embed: interrupted; run the same command again to resume", file=sys.stderr)
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
