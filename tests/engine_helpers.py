"""Helpers shared by the engine and server tests: draining event streams, polling, and
building engines (alone or behind a live server) on a test model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import Done, EngineEvent, GenerationRequest, TextDelta, ToolSpec
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

# Two of Claude Code's tools, enough to make a prompt look like an agent's main turn.
AGENT_TOOLS = [
    ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {"command": {}}}),
    ToolSpec("Read", "Read a file", {"type": "object", "properties": {"file_path": {}}}),
]


async def collect(events: AsyncIterator[EngineEvent]) -> list[EngineEvent]:
    """Every event of a stream, in order."""
    return [event async for event in events]


def text_of(events: list[EngineEvent]) -> str:
    """The visible text of a stream's events."""
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def run(engine: Engine, request: GenerationRequest) -> tuple[Done, str]:
    """Run one request to its end: its Done event and its visible text."""
    events: list[EngineEvent] = [e async for e in engine.submit(request)]
    done = events[-1]
    assert isinstance(done, Done)
    return done, text_of(events)


async def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, poll_s: float = 0.01
) -> None:
    """Poll `condition` every `poll_s` seconds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(poll_s)


@contextmanager
def engine_maker(model_dir: Path, **defaults: Any) -> Iterator[Callable[..., Engine]]:
    """A factory of engines on `model_dir` (keyword arguments override `defaults`); every
    engine it made is closed on exit."""
    engines: list[Engine] = []

    def make(**kw: Any) -> Engine:
        engine = Engine(EngineConfig(**{"model": str(model_dir), **defaults, **kw}))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@contextmanager
def served_engine(
    model_dir: Path, token: str, **config: Any
) -> Iterator[tuple[Engine, ServerHandle]]:
    """A started engine on `model_dir` (`config`: more EngineConfig fields, such as a
    `logits_hook` that scripts its output) behind a live server that wants `token`; the
    server stops, then the engine closes, on exit."""
    engine = Engine(EngineConfig(model=str(model_dir), **config))
    engine.start()
    handle = start_server(engine, ServerSettings(auth_token=token))
    try:
        yield engine, handle
    finally:
        handle.stop()
        engine.close()


class FakeClock:
    """A monotonic clock that moves only when told to (thread-safe)."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
