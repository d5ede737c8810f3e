"""The idle sweeper: cache clear and keep-alive unload on schedule (injected clock), never
during a request, and a request after an unload loads the model again."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from engine_helpers import FakeClock, collect, engine_maker
from engine_helpers import wait_until as shared_wait_until
from typer.testing import CliRunner

from mlxlaunch.cli.main import app
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.sweeper import IdleSweeper
from mlxlaunch.engine.settings import engine_tuning, parse_duration
from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest, TextDelta
from mlxlaunch.errors import ConfigError
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server
from mlxlaunch.testing.scripted import ScriptedOutput

POLL_S = 0.01  # the worker's idle poll in these tests
wait_until = functools.partial(shared_wait_until, poll_s=POLL_S)


def request(name: str, max_tokens: int = 4) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", f"hello {name}")], max_tokens=max_tokens, request_id=name
    )


async def polls(n: int = 20) -> None:
    """Give the idle worker `n` chances to act (to assert that it did not)."""
    await asyncio.sleep(n * POLL_S)


@pytest.fixture
def make_engine(tiny_model_dir: Path) -> Iterator[Callable[..., Engine]]:
    with engine_maker(tiny_model_dir, sweep_poll_s=POLL_S) as make:
        yield make


# --- durations and the policy ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800.0), ("90s", 90.0), ("1.5h", 5400.0), ("2d", 172800.0), ("45", 45.0),
     ("0", 0.0), (" 10 M ", 600.0), ("never", None), ("forever", None), ("-1", None),
     (None, None)],
)  # fmt: skip
def test_parse_duration(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "1e3", "-5m", "m"])
def test_parse_duration_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_engine_tuning_turns_flags_into_config() -> None:
    tuning = engine_tuning(
        max_concurrency=3, idle_clear="never", keep_alive="30m", memory_fraction=0.5
    )
    assert tuning == {
        "max_concurrency": 3,
        "idle_clear_s": None,
        "keep_alive_s": 1800.0,
        "memory_fraction": 0.5,
    }
    assert (
        engine_tuning(max_concurrency=None, idle_clear=None, keep_alive=None, memory_fraction=None)
        == {}
    )
    with pytest.raises(ConfigError, match="not a duration"):
        engine_tuning(max_concurrency=None, idle_clear=None, keep_alive="x", memory_fraction=None)


def test_sweeper_policy() -> None:
    clock = FakeClock()
    sweeper = IdleSweeper(idle_clear_s=30, keep_alive_s=120, clock=clock)
    assert sweeper.due(loaded=True, busy=False) is None
    clock.advance(30)
    assert sweeper.due(loaded=True, busy=True) is None  # never with work in the worker
    assert sweeper.due(loaded=True, busy=False) == "clear"
    sweeper.done("clear")
    assert sweeper.due(loaded=True, busy=False) is None  # once per idle period
    sweeper.begin()
    clock.advance(500)
    assert sweeper.due(loaded=True, busy=False) is None  # a request is in flight
    sweeper.end()  # the idle period starts when the last request ends
    clock.advance(119)
    assert sweeper.due(loaded=True, busy=False) == "clear"
    clock.advance(1)
    assert sweeper.due(loaded=True, busy=False) == "unload"
    assert sweeper.due(loaded=False, busy=False) is None  # nothing left to do


# --- the engine -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_sweeper_clears_then_unloads_on_schedule_and_a_request_reloads(
    make_engine: Callable[..., Engine],
) -> None:
    clock = FakeClock()
    engine = make_engine(clock=clock, idle_clear_s=30, keep_alive_s=600)
    assert isinstance((await collect(engine.submit(request("first"))))[-1], Done)
    clock.advance(29)
    await polls()
    assert engine.stats().counters.idle_cache_clears == 0
    clock.advance(1)
    await wait_until(lambda: engine.stats().counters.idle_cache_clears == 1)
    assert engine.stats().state == "loaded"
    assert engine.stats().memory_cache_bytes == 0  # cleared, and the figure refreshed
    clock.advance(569)
    await polls()
    assert engine.stats().state == "loaded" and engine.stats().counters.idle_cache_clears == 1
    clock.advance(1)
    await wait_until(lambda: engine.stats().state == "unloaded")
    assert engine.stats().counters.idle_unloads == 1 and engine.model_info is None
    # The next request loads the model again and is served.
    events = await collect(engine.submit(request("after")))
    assert isinstance(events[-1], Done) and events[-1].usage.output_tokens >= 1
    assert engine.stats().state == "loaded"
    # So does an explicit load (not answered from the earlier, finished load).
    clock.advance(600)
    await wait_until(lambda: engine.stats().state == "unloaded")
    assert engine.stats().counters.idle_unloads == 2
    info = await engine.load()
    assert engine.stats().state == "loaded" and engine.model_info is info


@pytest.mark.slow
async def test_never_during_a_request(make_engine: Callable[..., Engine]) -> None:
    clock = FakeClock()
    scripted = ScriptedOutput()
    scripted.enqueue(" ".join(f"w{i}" for i in range(3000)))
    engine = make_engine(clock=clock, idle_clear_s=5, keep_alive_s=10, logits_hook=scripted)
    events = engine.submit(request("long", max_tokens=3000))
    async for event in events:
        if isinstance(event, TextDelta):
            break
    clock.advance(100)  # far past both deadlines, while the request runs
    await polls()
    stats = engine.stats()
    assert stats.state == "loaded" and stats.running == 1
    assert stats.counters.idle_cache_clears == 0 and stats.counters.idle_unloads == 0
    await events.aclose()  # type: ignore[attr-defined]
    await wait_until(lambda: engine.stats().running == 0)
    await polls()  # the idle period starts only now
    assert engine.stats().state == "loaded"
    clock.advance(10)
    await wait_until(lambda: engine.stats().state == "unloaded")


@pytest.mark.slow
async def test_keep_alive_zero_unloads_at_once_and_every_request_still_succeeds(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(keep_alive_s=0)
    for n in range(3):
        events = await collect(engine.submit(request(f"r{n}")))
        assert isinstance(events[-1], Done)
        await wait_until(lambda: engine.stats().state == "unloaded")
    assert engine.stats().counters.idle_unloads == 3
    # Requests racing the unloads (several at once, while it unloads) all succeed too.
    results = await asyncio.gather(*(collect(engine.submit(request(f"c{n}"))) for n in range(4)))
    assert all(isinstance(events[-1], Done) for events in results)


@pytest.mark.slow
async def test_a_request_after_an_unload_succeeds_over_http(tiny_model_dir: Path) -> None:
    clock = FakeClock()
    config = EngineConfig(
        model=str(tiny_model_dir), clock=clock, keep_alive_s=60, sweep_poll_s=POLL_S
    )
    engine = Engine(config)
    engine.start()
    server = start_server(engine, ServerSettings())
    payload = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            assert (await client.post("/v1/messages", json=payload)).status_code == 200
            clock.advance(60)
            await wait_until(lambda: engine.stats().state == "unloaded")
            health = (await client.get("/health")).json()
            assert health["model"] == "unloaded"
            again = await client.post("/v1/messages", json=payload)
            assert again.status_code == 200 and again.json()["usage"]["output_tokens"] >= 1
        assert engine.stats().counters.idle_unloads == 1
    finally:
        server.stop()
        engine.close()


# --- the flags ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["serve", "--model", "demo"], ["launch", "claude"]])
def test_bad_durations_are_usage_errors(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--keep-alive", "soon"])
    assert result.exit_code == 2
    assert "not a duration" in result.output
    result = CliRunner().invoke(app, [*command, "--idle-clear", "whenever"])
    assert result.exit_code == 2


@pytest.mark.parametrize("command", [["serve"], ["launch", "claude"]])
def test_scheduler_flags_are_documented(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    for flag in ("--keep-alive", "--idle-clear", "--max-concurrency", "--memory-fraction"):
        assert flag in result.output
