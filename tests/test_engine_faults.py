"""A fault inside the engine (a bug, not the request's) ends the requests it hit with an error,
logged with its traceback, and the engine goes on serving: no client is left waiting.

Before, an exception while a job was queued (or in a step outside the batch's own guarded
call) was logged as "engine command failed" or ended the loop, and the request waited until
its client gave up. The faults are injected at the worker's seams (its prefix-cache planner,
its speed meter): the real engine, model and batch run around them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from engine_helpers import collect

from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import ChatMessage, Done, GenerationFailed, GenerationRequest, Sampling
from mlxlaunch.testing.scripted import ScriptedOutput


def request(request_id: str) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", f"hello {request_id}")],
        max_tokens=4,
        sampling=Sampling(temperature=0.0),
        request_id=request_id,
    )


async def outcome(engine: Engine, request_id: str) -> Any:
    """The last event of a request, or the error it raised (within 60 s: never a hang)."""
    try:
        events = await asyncio.wait_for(collect(engine.submit(request(request_id))), 60)
    except GenerationFailed as exc:
        return exc
    return events[-1]


def fail_once(target: Any, name: str) -> None:
    """Make `target.name` raise on its next call only."""
    original = getattr(target, name)
    calls = {"n": 0}

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return original(*args, **kwargs)

    setattr(target, name, broken)


@pytest.mark.slow
@pytest.mark.parametrize("seam", ["queueing", "stepping"])
def test_a_fault_ends_its_request_with_an_error_and_the_next_one_is_served(
    engine: Engine, scripted: ScriptedOutput, seam: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine.start()
    asyncio.run(engine.load())
    worker = engine._worker
    if seam == "queueing":
        fail_once(worker._caches, "plan")
    else:
        fail_once(worker._speeds, "measure")
    with caplog.at_level(logging.ERROR):
        failed = asyncio.run(outcome(engine, "hit"))
    assert isinstance(failed, GenerationFailed) and "injected fault" in str(failed)
    assert any(r.exc_info for r in caplog.records), "no traceback in the log"
    scripted.enqueue("fine")
    served = asyncio.run(outcome(engine, "next"))
    assert isinstance(served, Done)
    assert engine.stats().counters.requests_failed == 1
