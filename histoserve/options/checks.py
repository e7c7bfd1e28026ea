"""Which values of :class:`~histoserve.embedding.config.EmbedConfig` are allowed.

Run by the config itself (its ``__post_init__``; each check takes the config,
whose module this one does not import), so the command line and
the API check the same things in one place: a bad value raises
:class:`~histoserve.errors.UsageError` (exit status 2) naming the option
(by its flag) and the value, never a credential.
"""

from __future__ import annotations

from typing import Any

from histoserve.errors import UsageError
from histoserve.limits import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_COUNT,
    MAX_PRIORITY,
    MAX_READ_PX,
    MAX_SECONDS,
    MAX_SLIDES_IN_FLIGHT,
    MAX_THREADS,
    mpp_problem,
)
from histoserve.options.declare import declared
from histoserve.remote.auth import check_url, redact_url

URL_SCHEMES = ("http://", "https://", "grpc://", "grpcs://")


def check_sources(config: Any) -> None:
    """UsageError unless the URLs, the slides and each declared option's choice are usable."""
    if not config.urls:
        raise UsageError("no server given: pass --url http://host:port (or grpc://host:port)")
    flags = [("--url", u) for u in config.urls] + [("--tissue-url", u) for u in config.tissue_urls]
    flags += [("--slide-url", u) for u in config.slide_urls]
    for flag, url in flags:
        check_url(url, flag)  # no user-info: no URL shown anywhere carries a password
        if not url.startswith(URL_SCHEMES) or not url.split("://", 1)[1].strip("/"):
            raise UsageError(
                f"{flag} {redact_url(url)!r}: must be http://, https://, grpc:// or "
                "grpcs://host:port"
            )
    if config.credentials is not None:
        config.credentials.check_urls(config.urls + config.tissue_urls + config.slide_urls)
    if not config.slides and config.manifest is None:
        raise UsageError("no slides given: pass slide paths or --manifest slides.csv")
    for option in declared(type(config)):
        value = getattr(config, option.field)
        if option.choices and value not in option.choices:
            choices = ", ".join(option.choices)
            raise UsageError(f"{option.flag} {value!r}: must be one of {choices}")
    if config.slide_model is not None and config.mode == "prediction":
        raise UsageError("--slide-model takes tile features: use an embedding mode")
    if config.layout != "flat" and config.mode == "prediction":
        raise UsageError(f"--layout {config.layout} writes features: use an embedding mode")
    if not config.tissue:
        raise UsageError("--tissue must be otsu, none or a served model name, got ''")
    if config.shard is not None:
        index, count = config.shard
        if not 0 <= index < count:
            raise UsageError(f"--shard {index}/{count}: need 0 <= I < N")


def _check_mpps(config: Any) -> None:
    """``--target-mpp`` and ``--mpp-override`` in the plausible range (a mm/um slip is 1e-4)."""
    for flag, value in (
        ("--target-mpp", config.target_mpp),
        ("--mpp-override", config.mpp_override),
    ):
        problem = None if value is None else mpp_problem(value)
        if problem is not None:
            raise UsageError(f"{flag} {value!r}: {problem}")


def check_numbers(config: Any) -> None:
    """UsageError unless every number of ``config`` is in its range (limits: :mod:`histoserve.limits`)."""
    for flag, value, most in (
        ("--timeout-s", config.timeout_s, MAX_SECONDS),
        ("--recycle-s", config.recycle_s, MAX_SECONDS),
        ("--tile-size", config.tile_size, MAX_READ_PX),
        ("--overlap", config.overlap, MAX_READ_PX),
        ("--batch-size", config.batch_size, MAX_BATCH),
        ("--max-attempts", config.max_attempts, MAX_ATTEMPTS),
        ("--concurrency", config.concurrency, MAX_THREADS),
        ("--read-workers", config.read_workers, MAX_THREADS),
        ("--queue-batches", config.queue_batches, MAX_THREADS),
        ("--slides-in-flight", config.slides_in_flight, MAX_SLIDES_IN_FLIGHT),
        ("--recycle-requests", config.recycle_requests, MAX_COUNT),
        ("--max-tiles-per-slide", config.max_tiles_per_slide, MAX_COUNT),
        ("--accept-bad-tiles", config.accept_bad_tiles, MAX_COUNT),
    ):
        if value is not None and not value <= most:  # NaN and infinity fail too
            raise UsageError(f"{flag} must be at most {most:,}, got {value!r}")
    positive = {
        "--target-mpp": config.target_mpp,
        "--mpp-override": config.mpp_override,
        "--timeout-s": config.timeout_s,
    }
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value!r}")
    _check_mpps(config)
    at_least_one = {
        "--tile-size": config.tile_size,
        "--batch-size": config.batch_size,
        "--max-attempts": config.max_attempts,
        "--recycle-requests": config.recycle_requests,
        "--slides-in-flight": config.slides_in_flight,
        "--max-tiles-per-slide": config.max_tiles_per_slide,
    }
    for flag, value in at_least_one.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value!r}")
    zero_or_more = {
        "--concurrency": config.concurrency,
        "--read-workers": config.read_workers,
        "--queue-batches": config.queue_batches,
    }
    for flag, value in zero_or_more.items():
        if value < 0:
            raise UsageError(f"{flag} must be >= 1 (0: the default), got {value!r}")
    if not 0.0 <= config.mpp_tolerance < 1.0:
        raise UsageError(f"--mpp-tolerance must be in [0, 1), got {config.mpp_tolerance!r}")
    if config.overlap < 0:
        raise UsageError(f"--overlap must be >= 0 px, got {config.overlap!r}")
    if not 0 <= config.priority <= MAX_PRIORITY:
        raise UsageError(f"--priority must be in 0..{MAX_PRIORITY:,}, got {config.priority!r}")
    if config.accept_bad_tiles < 0:
        raise UsageError(f"--accept-bad-tiles must be >= 0, got {config.accept_bad_tiles!r}")
    if not 0.0 <= config.min_tissue <= 1.0:
        raise UsageError(f"--min-tissue must be in [0, 1], got {config.min_tissue!r}")
    if not config.recycle_s > 0:
        raise UsageError(f"--recycle-s must be > 0, got {config.recycle_s!r}")
