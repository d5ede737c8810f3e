"""Helpers shared by the engine and server tests: draining event streams, polling, and
building engines (alone or behind a live server) on a test model."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import Done, EngineEvent, GenerationRequest, TextDelta, ToolSpec
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.scripted import ScriptedOutput

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


@dataclass
class ScriptedServer:
    """A live server whose engine's output is scripted (`scripted.enqueue`), with the real
    SDKs of both vendors as its clients."""

    server: ServerHandle
    scripted: ScriptedOutput
    token: str
    directory: Path

    @property
    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.server.url, api_key=self.token, max_retries=0)

    @property
    def openai(self) -> Any:  # untyped: tests send loose dicts
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=self.token, max_retries=0)

    def post(self, path: str, body: bytes | dict[str, Any]) -> httpx.Response:
        """`body` (JSON, or raw bytes) to `path`, with the token."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"authorization": f"Bearer {self.token}", "content-type": "application/json"}
        return httpx.post(self.server.url + path, content=content, headers=headers, timeout=300)


@contextmanager
def scripted_server(model_dir: Path, token: str) -> Iterator[ScriptedServer]:
    """`served_engine` with a `ScriptedOutput` at the model boundary."""
    scripted = ScriptedOutput()
    with served_engine(model_dir, token, logits_hook=scripted) as (_, handle):
        yield ScriptedServer(handle, scripted, token, model_dir)


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
