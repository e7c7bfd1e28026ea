"""``--frontends``: how many, and what each process of a several-front-end pod sets up."""

from __future__ import annotations

import logging

import pytest

from predictor.multiprocess.process import frontend_count, tag_log_lines


@pytest.mark.parametrize(
    ("value", "cpus", "want"), [("1", 8, 1), ("3", 2, 3), ("auto", 8, 7), ("auto", 1, 1)]
)
def test_frontend_count(value, cpus, want):
    assert frontend_count(value, cpus) == want


@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_a_bad_frontend_count_names_the_flag(value):
    with pytest.raises(ValueError, match="--frontends"):
        frontend_count(value, 4)


def test_every_log_line_carries_its_process_tag(caplog):
    factory = logging.getLogRecordFactory()
    try:
        tag_log_lines("frontend-3")
        with caplog.at_level(logging.INFO, logger="histoserve"):
            logging.getLogger("histoserve").info("serving %s", "h0-mini")
    finally:
        logging.setLogRecordFactory(factory)
    assert caplog.messages == ["[frontend-3] serving h0-mini"]
