"""``histoserve embed --slide-model NAME``: the slide head over each slide's features once done.

:func:`check_slide_model` runs before any slide is embedded (a model that
is no slide head, or no server, is a usage error up front);
:func:`run_slide_model` after the tiles: the very code path of ``histoserve
aggregate`` (:func:`~histoserve.heads.aggregate.aggregate`) over the
feature files this run's slides have (done now or skipped as done before),
with the run's layout, credentials, ``qc`` and ``--slides-in-flight``;
results beside the features, ``qc/``, ``slides.csv`` and ``slides_status.csv``
in ``--out``. A slide whose head fails is moved from the run's ``done`` (or
``skipped``) to ``failed`` with ``slide model <name>: <reason>`` (its tile
features stay done: a re-run skips them and runs the head again), so the
exit status is 1. ``report.html`` is written again with the heatmaps.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from histoserve.errors import HistoserveError
from histoserve.heads.aggregate import AggregateConfig, aggregate
from histoserve.heads.head import HeadInfo, head_info
from histoserve.remote.auth import Credentials
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import RetryPolicy
from histoserve.results.layouts import trident_encoder

if TYPE_CHECKING:
    from histoserve.embedding.config import EmbedConfig

logger = logging.getLogger("histoserve.embed")


class EmbedSummary(Protocol):
    """What :func:`run_slide_model` changes of the run's summary (slide ids by outcome)."""

    done: list[str]
    skipped: list[str]
    failed: dict[str, str]


def check_slide_model(config: EmbedConfig) -> HeadInfo | None:
    """The slide model's description (None without ``--slide-model``).

    Raises:
        UsageError: Not a slide model, URLs disagreeing.
        RemoteError: Its server cannot be reached.
    """
    if config.slide_model is None:
        return None
    retry = RetryPolicy(max_attempts=config.max_attempts)
    urls = config.slide_urls or config.urls
    creds = config.credentials or Credentials()
    with HistoserveClient(
        urls, config.slide_model, config.timeout_s, credentials=creds, retry=retry
    ) as client:
        return head_info(client)


def run_slide_model(config: EmbedConfig, summary: EmbedSummary) -> None:
    """Runs the slide model over the run's done slides; failures go into ``summary.failed``."""
    if config.slide_model is None:
        return
    ids = frozenset(summary.done) | frozenset(summary.skipped)
    if not ids:
        return
    model = config.slide_model
    aggregate_config = AggregateConfig(
        features_dir=config.out_dir,
        urls=config.slide_urls or config.urls,
        model=model,
        out_dir=config.out_dir,
        layout=config.layout,
        encoder=trident_encoder(config.model) if config.model else None,
        overlap=config.overlap,
        slide_ids=ids,
        qc=config.qc,
        slides_in_flight=config.slides_in_flight,
        timeout_s=config.timeout_s,
        max_attempts=config.max_attempts,
        priority=config.priority,
        credentials=config.credentials,
    )
    try:
        failed = aggregate(aggregate_config).failed
    except HistoserveError as exc:  # no feature files to be found, the server gone: every slide
        failed = dict.fromkeys(ids, str(exc))
    for slide_id, reason in failed.items():
        summary.failed[slide_id] = f"slide model {model}: {reason}"
        for kept in (summary.done, summary.skipped):
            if slide_id in kept:
                kept.remove(slide_id)
    if config.qc:
        _report(config)


def _report(config: EmbedConfig) -> None:
    from histoserve.review.report import write_report

    try:
        write_report(config.out_dir)
    except Exception as exc:  # the report is for people: it never ends a run
        logger.warning("report.html not written: %s", exc)
