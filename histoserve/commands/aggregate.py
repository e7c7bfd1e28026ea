"""``histoserve aggregate``: the command line over :func:`~histoserve.heads.aggregate.aggregate`.

Exit status: 0 when every slide is done or skipped, 1 when some failed (see
``slides_status.csv``) or the server cannot be reached, 2 for usage errors
(no feature files, a bad ``--shard``, not a slide model, an unknown flag),
found before any slide is sent, 130 on Ctrl-C (re-running resumes).
Everything printed goes through :func:`~histoserve.text.printable`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from histoserve.limits import BULK_PRIORITY
from histoserve.options.service import PRIORITY_HELP
from histoserve.results.sources import SOURCE_LAYOUTS
from histoserve.text import printable

if TYPE_CHECKING:
    from histoserve.heads.aggregate import AggregateConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    """The ``histoserve aggregate`` parser."""
    parser = argparse.ArgumentParser(
        prog="histoserve aggregate",
        description="Run a served slide model over existing tile feature files.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("features_dir", type=Path, help="folder of feature files (flat, TRIDENT job, CLAM)")
    add("--url", action="append", dest="urls", required=True, metavar="URL",
        help="where the slide model is served (http(s):// or grpc(s)://); repeat for several")  # fmt: skip
    add("--model", required=True, help="the slide model's name")
    add("--layout", default="auto", choices=SOURCE_LAYOUTS, help="layout of the feature files")
    add(
        "--shard",
        help="I/N; N with I from $JOB_COMPLETION_INDEX or $SLURM_ARRAY_TASK_ID; auto (Slurm)",
    )
    add("--force", action="store_true", help="run slides that already have a result")
    add("--no-coords", dest="send_coords", action="store_false", help="send features only")
    add("--no-qc", dest="qc", action="store_false", help="no heatmaps, no QuPath GeoJSON")
    add("--slides", dest="slides_dir", type=Path, metavar="DIR",
        help="where to find the slides under the pictures, by file name or slide id, checked "
        "against the features' recorded identity (default: each features file's recorded path)")  # fmt: skip
    add("--slides-in-flight", type=int, default=2, help="slides in progress at once")
    add("--timeout-s", type=float, default=300.0, help="per-request timeout")
    add("--max-attempts", type=int, default=8, help="attempts per request (503, 429, resets)")
    add("--priority", type=int, default=BULK_PRIORITY, help=PRIORITY_HELP)
    add("--ca-cert", type=Path, help="CA bundle (PEM) for https:// and grpcs:// servers")
    add("--token-file", type=Path, help="bearer token file (default: $HISTOSERVE_TOKEN)")
    add(
        "--trust-env",
        action="store_true",
        help="use the environment's proxy variables (HTTP_PROXY, ...); ignored by default",
    )
    add("--header", action="append", dest="headers", default=[], metavar="'NAME: VALUE'",
        help="extra header on every request; repeat for several")  # fmt: skip
    return parser


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> AggregateConfig:
    """The run's config from parsed flags (UsageError when bad)."""
    from histoserve.heads.aggregate import AggregateConfig
    from histoserve.remote.auth import load_credentials
    from histoserve.slides.manifest import parse_shard

    return AggregateConfig(
        features_dir=args.features_dir,
        urls=tuple(args.urls),
        model=args.model,
        layout=args.layout,
        shard=parse_shard(args.shard, env),
        force=args.force,
        send_coords=args.send_coords,
        qc=args.qc,
        slides_dir=args.slides_dir,
        slides_in_flight=args.slides_in_flight,
        timeout_s=args.timeout_s,
        max_attempts=args.max_attempts,
        priority=args.priority,
        credentials=load_credentials(
            args.ca_cert, args.token_file, args.headers, env, args.trust_env
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``histoserve aggregate``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except KeyboardInterrupt:
        _say("interrupted; run the same command again to resume")
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from histoserve.errors import HistoserveError, UsageError
    from histoserve.heads.aggregate import SLIDES_STATUS_FILE, aggregate

    def said(slide_id: str, status: str, reason: str) -> None:
        _say(f"{slide_id}: {status}" + (f" ({reason})" if reason else ""))

    try:
        summary = aggregate(config_from_args(args, os.environ), said)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except HistoserveError as exc:
        _say(str(exc))
        return EXIT_FAILED
    where = args.features_dir
    _say(
        f"{len(summary.done)} done, {len(summary.skipped)} skipped, {len(summary.failed)} failed "
        f"in {summary.seconds:.1f} s; {where / 'slides.csv'}, {where / SLIDES_STATUS_FILE}"
    )
    return EXIT_FAILED if summary.failed else EXIT_OK


def _say(message: str) -> None:
    print(f"histoserve aggregate: {printable(message)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
