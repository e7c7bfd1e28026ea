"""``histoserve embed``: the command line over :func:`histoserve.api.embed`.

Each flag is the keyword argument of the same name, with the same default
(read from :func:`~histoserve.api.embed_defaults`, so the two cannot drift).

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

from histoserve.embedding.config import (
    LAYOUTS,
    MODES,
    PROGRESS,
    READERS,
    RESIZES,
    TRANSPORTS,
    EmbedConfig,
)
from histoserve.text import printable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# A repeatable flag's list is the API's argument of the flag's own name.
_OPTION_OF_DEST = {
    "urls": "url",
    "tissue_urls": "tissue_url",
    "slide_urls": "slide_url",
    "headers": "header",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``histoserve embed`` parser (flags as in the README)."""
    parser = _Parser(
        prog="histoserve embed",
        description="Embed whole slides with a histoserve model: one HDF5 file per slide.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _input_flags(parser)
    _scale_flags(parser)
    _call_flags(parser)
    from histoserve.api import embed_defaults

    repeatable = {"slides", *_OPTION_OF_DEST.values()}  # lists argparse appends to
    parser.set_defaults(**{k: v for k, v in embed_defaults().items() if k not in repeatable})
    return parser


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


def _input_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("slides", nargs="*", type=Path, help="slide files (the slide id is the file stem)")
    add("--manifest", type=Path, help="CSV with slide_id,path[,mpp][,bulk_rna][,mask]")
    add(
        "--url",
        action="append",
        dest="urls",
        required=True,
        metavar="URL",
        help="server, http(s)://host:port or grpc(s)://host:port; repeat for several",
    )
    add("--out", type=Path, required=True, help="output folder (<slide_id>.h5, status.csv)")
    add("--model", help="model name (default: the only model the server serves)")
    add("--mode", choices=MODES)
    add(
        "--force",
        action="store_true",
        help="re-embed slides that are already done; into an --out made with other settings, "
        "record this run's",
    )
    add(
        "--shard",
        help="I/N: every N-th slide from the I-th; N alone: I from $JOB_COMPLETION_INDEX or "
        "$SLURM_ARRAY_TASK_ID; auto: I and N from a Slurm array",
    )
    add("--progress", choices=PROGRESS)
    add("--ca-cert", type=Path, help="CA bundle (PEM) for https:// and grpcs:// servers")
    add("--token-file", type=Path, help="bearer token file (default: $HISTOSERVE_TOKEN)")
    add(
        "--trust-env",
        action="store_true",
        help="use the environment's proxy variables (HTTP_PROXY, ...); ignored by default",
    )
    add(
        "--header",
        action="append",
        dest="headers",
        default=[],
        metavar="'NAME: VALUE'",
        help="extra header (gRPC metadata on gRPC) on every request; repeat for several",
    )
    add(
        "--layout",
        choices=LAYOUTS,
        help="output files: flat (<id>.h5), trident (TRIDENT's job folder), clam (h5_files, pt_files)",
    )


def _scale_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--target-mpp", type=float, help="tile mpp (default: the model's)")
    add("--tile-size", type=int, help="tile edge in px (default: the model's)")
    add("--mpp-override", type=float, help="level-0 mpp for every slide, ahead of metadata")
    add("--mpp-tolerance", type=float, help="relative tolerance for equal mpp")
    add("--tissue", help="otsu, none, or a served tissue-seg model name")
    add(
        "--tissue-url",
        action="append",
        dest="tissue_urls",
        default=[],
        metavar="URL",
        help="where the --tissue model is served (default: the --url servers)",
    )
    add("--min-tissue", type=float, help="least tissue fraction of a kept tile")
    add(
        "--masks",
        type=Path,
        metavar="DIR",
        help="per-slide masks <slide_id>.geojson (QuPath, level-0 px) or .png, instead of --tissue",
    )
    add(
        "--accept-bad-tiles",
        type=int,
        metavar="N",
        help="a slide with at most N unreadable tiles is done (with holes) instead of failed",
    )
    add("--no-qc", dest="qc", action="store_false", help="no qc/ pictures and no report.html")
    add("--overlap", type=int, metavar="PX", help="pixels neighbouring tiles share")
    add(
        "--reader",
        choices=READERS,
        help="native: JPEG-tiled TIFF/SVS read directly (OpenSlide's pixels); auto: where it applies",
    )
    add(
        "--resize",
        choices=RESIZES,
        help="read squares to tiles: the spec's filter, area averaging, or a reduced JPEG decode",
    )
    add(
        "--transport",
        choices=TRANSPORTS,
        help="jpeg: the slide's own JPEG tiles to a server that decodes them; auto: where it applies",
    )
    add("--slide-model", help="a served slide model run over each slide's features when done")
    add(
        "--slide-url",
        action="append",
        dest="slide_urls",
        default=[],
        metavar="URL",
        help="where --slide-model is served (default: the --url servers)",
    )
    add(
        "--max-tiles-per-slide",
        type=int,
        metavar="N",
        help="a slide whose grid plans more tiles fails before any is read",
    )


def _call_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--batch-size", type=int, help="tiles per request")
    add("--concurrency", type=int, help="requests in flight (default 4 per URL)")
    add("--read-workers", type=int, help="tile reading threads (default: CPUs, <= 8)")
    add("--queue-batches", type=int, help=argparse.SUPPRESS)
    add("--slides-in-flight", type=int, help="slides in progress at once")
    add("--max-attempts", type=int, help="attempts per request (503, 429, resets)")
    add("--timeout-s", type=float, help="per-request timeout")
    add("--recycle-requests", type=int, help="new connections after N requests")
    add("--recycle-s", type=float, help="...or after this many seconds")


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> EmbedConfig:
    """The :class:`~histoserve.embedding.config.EmbedConfig` of parsed flags (UsageError when bad)."""
    from histoserve.api import embed_config

    return embed_config(options_of(args), env)


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """Parsed flags as :func:`histoserve.api.embed`'s keyword arguments."""
    options = vars(args).copy()
    for dest, name in _OPTION_OF_DEST.items():
        options[name] = options.pop(dest)
    return options


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
    from histoserve.errors import EmbedError, UsageError

    try:
        summary = embed(**options_of(args), env=os.environ)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except EmbedError as exc:
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
