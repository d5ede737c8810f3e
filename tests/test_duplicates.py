"""Duplicate requests (Claude Code's retry of a request still running) share one generation:
replay then live events, one generation in stats, and leaving only cancels with the last."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import collect, text_of, user_turn, wait_until

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.duplicates import generation_key
from mlxlaunch.engine.types import (
    Admitted,
    Done,
    EngineEvent,
    GenerationRequest,
    Sampling,
    TextDelta,
    ToolSpec,
)
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server
from mlxlaunch.testing.scripted import ScriptedOutput

LONG = " ".join(f"w{i}" for i in range(3000))


def request(
    request_id: str, max_tokens: int = 300, text: str = "the same question"
) -> GenerationRequest:
    # Claude Code samples; duplicates still share
    return user_turn(request_id, text, max_tokens, temperature=0.7)


async def take_deltas(events: AsyncIterator[EngineEvent], n: int) -> list[EngineEvent]:
    """Events up to and including the `n`-th TextDelta."""
    seen: list[EngineEvent] = []
    async for event in events:
        seen.append(event)
        if sum(isinstance(e, TextDelta) for e in seen) >= n:
            break
    return seen


# --- the key ------------------------------------------------------------------------------


def test_the_key_ignores_ids_and_sees_every_generation_setting() -> None:
    base = request("a")
    tokens = [1, 2, 3]
    key = generation_key(tokens, base, 300)
    assert (
        generation_key(tokens, dataclasses.replace(base, request_id="b", kind="main"), 300) == key
    )
    bash = ToolSpec(name="Bash", description="run", parameters={"type": "object"})
    different = [
        generation_key([1, 2, 4], base, 300),
        generation_key(tokens, base, 299),
        generation_key(tokens, dataclasses.replace(base, max_tokens=301), 300),
        generation_key(tokens, dataclasses.replace(base, sampling=Sampling(temperature=0.2)), 300),
        generation_key(tokens, dataclasses.replace(base, stop_sequences=["END"]), 300),
        generation_key(tokens, dataclasses.replace(base, tools=[bash]), 300),
        generation_key(tokens, dataclasses.replace(base, thinking=True), 300),
    ]
    assert key not in different and len(set(different)) == len(different)


# --- the engine ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_duplicate_joins_the_running_generation_with_a_replay(
    engine: Engine, scripted: ScriptedOutput
) -> None:
    scripted.enqueue(LONG)
    scripted.enqueue("a second, separate generation")
    first = engine.submit(request("first"))
    early = await take_deltas(first, 10)  # well into the stream
    second_events = await collect(engine.submit(request("retry")))
    first_events = early + await collect(first)
    # Same computation: identical content, both complete; the replay included the start.
    assert isinstance(second_events[0], Admitted) and isinstance(second_events[-1], Done)
    assert text_of(second_events) == text_of(first_events)
    assert len(text_of(first_events).split()) > 100
    assert second_events[-1] == first_events[-1]
    counters = engine.stats().counters
    assert counters.requests_admitted == 1 and counters.requests_deduplicated == 1
    assert counters.requests_completed == 1 and counters.generated_tokens == 300
    # Once it has finished, the same request is computed afresh.
    again = await collect(engine.submit(request("later")))
    assert text_of(again).strip() == "a second, separate generation"
    assert engine.stats().counters.requests_admitted == 2


async def first_and_retry(
    engine: Engine, scripted: ScriptedOutput
) -> tuple[AsyncIterator[EngineEvent], AsyncIterator[EngineEvent]]:
    """One long generation with two listeners, the first request and its retry, each of which
    has received a few deltas."""
    scripted.enqueue(LONG)
    first = engine.submit(request("first", max_tokens=3000))
    await take_deltas(first, 3)
    second = engine.submit(request("retry", max_tokens=3000))
    await take_deltas(second, 3)
    return first, second


@pytest.mark.slow
async def test_one_listener_leaving_does_not_stop_the_others(
    engine: Engine, scripted: ScriptedOutput
) -> None:
    first, second = await first_and_retry(engine, scripted)
    # The original client goes away: the retry keeps receiving.
    await first.aclose()  # type: ignore[attr-defined]
    more = await take_deltas(second, 50)
    assert sum(isinstance(e, TextDelta) for e in more) == 50
    assert engine.stats().running == 1 and engine.stats().counters.requests_cancelled == 0
    # The last listener leaving cancels the generation within a step.
    await second.aclose()  # type: ignore[attr-defined]
    await wait_until(lambda: engine.stats().running == 0)
    assert engine.stats().counters.requests_cancelled == 1


@pytest.mark.slow
async def test_cancel_by_id_ends_only_that_listener(
    engine: Engine, scripted: ScriptedOutput
) -> None:
    first, second = await first_and_retry(engine, scripted)
    engine.cancel("retry")
    rest = await collect(second)
    done = rest[-1]
    assert isinstance(done, Done) and done.stop_reason == "cancelled"
    assert sum(isinstance(e, TextDelta) for e in await take_deltas(first, 20)) == 20
    assert engine.stats().running == 1
    engine.cancel("first")
    rest = await collect(first)
    assert isinstance(rest[-1], Done) and rest[-1].stop_reason == "cancelled"
    await wait_until(lambda: engine.stats().running == 0)
    assert engine.stats().counters.requests_cancelled == 1


@pytest.mark.slow
async def test_different_requests_are_not_shared(engine: Engine, scripted: ScriptedOutput) -> None:
    scripted.enqueue("one answer")
    scripted.enqueue("another answer")
    a, b = await asyncio.gather(
        collect(engine.submit(request("a", text="question one"))),
        collect(engine.submit(request("b", text="question two"))),
    )
    assert {text_of(a).strip(), text_of(b).strip()} == {"one answer", "another answer"}
    assert engine.stats().counters.requests_deduplicated == 0


# --- over HTTP ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_identical_http_requests_are_served_from_one_generation(
    tiny_model_dir: Path,
) -> None:
    scripted = ScriptedOutput()
    scripted.enqueue(LONG)
    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=scripted))
    engine.start()
    server = start_server(engine, ServerSettings())
    payload: dict[str, Any] = {
        "model": "m",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "please answer this"}],
    }
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            original = asyncio.create_task(client.post("/v1/messages", json=payload))
            await wait_until(lambda: engine.stats().running == 1)
            retry = await client.post("/v1/messages", json=payload)  # "timed out, retrying"
            first = await original
            counters = engine.stats().counters
            streamed = await client.post("/v1/messages", json={**payload, "stream": True})
        assert first.status_code == retry.status_code == 200
        a, b = first.json(), retry.json()
        assert a["id"] != b["id"]  # two responses…
        assert a["content"] == b["content"] and a["usage"] == b["usage"]  # …one computation
        assert a["usage"]["output_tokens"] == 400
        assert counters.requests_deduplicated == 1 and counters.requests_admitted == 1
        assert streamed.status_code == 200  # a finished generation is not reused
        assert engine.stats().counters.requests_admitted == 2
    finally:
        server.stop()
        engine.close()
