"""The one line each request leaves in the log (server/request_log.py)."""

from __future__ import annotations

import logging

import pytest

from mlxlaunch.engine.types import Done, TextDelta, Timings, Usage
from mlxlaunch.server.request_log import RequestLog


def line(caplog: pytest.LogCaptureFixture) -> str:
    (record,) = [r for r in caplog.records if r.name == "mlxlaunch.server"]
    return record.getMessage()


def test_a_stream_cut_short_logs_what_it_sent(caplog: pytest.LogCaptureFixture) -> None:
    """A stream ended by a shutdown or a cancel has no Done: it said output=0 after sending
    thousands of deltas. What was sent is what it reports."""
    request = RequestLog("req_1", "m", 0.0)
    for _ in range(2530):
        request.observe(TextDelta("x"))
    with caplog.at_level(logging.INFO, logger="mlxlaunch.server"):
        request.finish(499)
    assert " output=2530 " in line(caplog) and line(caplog).endswith("status=499")


def test_a_finished_request_logs_its_usage_and_drafts(caplog: pytest.LogCaptureFixture) -> None:
    request = RequestLog("req_2", "m", 0.0)
    request.observe(TextDelta("x"))
    timings = Timings(ttft_s=0.5, decode_tps=40.0, drafted_tokens=30, accepted_tokens=21)
    request.observe(Done("end_turn", Usage(100, 90, 44), None, timings))
    with caplog.at_level(logging.INFO, logger="mlxlaunch.server"):
        request.finish(200)
    text = line(caplog)
    assert "prompt=100 cached=90 output=44 " in text and " draft=21/30 " in text
