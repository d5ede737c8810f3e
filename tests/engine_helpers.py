"""Helpers shared by the engine and server tests: draining event streams, polling, and
building engines (alone or behind a live server: `serve`, and the `served` fixture of
tests/served_fixtures.py) on a test model."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import anthropic
import httpx
import mlx.core as mx
import openai
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.types import (
    Admitted,
    ChatMessage,
    Done,
    EngineEvent,
    GenerationRequest,
    Sampling,
    TextDelta,
    ToolSpec,
)
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.scripted import ScriptedOutput

# Two of Claude Code's tools, enough to make a prompt look like an agent's main turn.
AGENT_TOOLS = [
    ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {"command": {}}}),
    ToolSpec("Read", "Read a file", {"type": "object", "properties": {"file_path": {}}}),
]


def messages_tool(
    name: str,
    description: str,
    properties: dict[str, Any],
    required: list[str] | None = None,
    closed: bool = False,
) -> dict[str, Any]:
    """A tool as the Messages API declares it: an object of `properties`, all of them required
    unless `required` names some; `closed`: no other keys allowed."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }
    if closed:
        schema["additionalProperties"] = False
    return {"name": name, "description": description, "input_schema": schema}


# The Bash tool as each API declares it, the call the tiny model is scripted to write (its
# template's Hermes markup), and the shortest conversation.
BASH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
BASH_TOOL = {"name": "Bash", "description": "Run a shell command", "input_schema": BASH_SCHEMA}
BASH_FUNCTION = {
    "type": "function",
    "function": {"name": "Bash", "description": "Run a shell command", "parameters": BASH_SCHEMA},
}
BASH_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
HI = [{"role": "user", "content": "hi"}]


async def collect(events: AsyncIterator[EngineEvent]) -> list[EngineEvent]:
    """Every event of a stream, in order."""
    return [event async for event in events]


def text_of(events: list[EngineEvent]) -> str:
    """The visible text of a stream's events."""
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def user_turn(
    request_id: str, text: str, max_tokens: int, temperature: float = 0.0
) -> GenerationRequest:
    """A request of one user turn of `text` (decoded greedily unless `temperature` says)."""
    return GenerationRequest(
        messages=[ChatMessage("user", text)],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=temperature),
        request_id=request_id,
    )


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


@asynccontextmanager
async def forced_streams(
    engine: Engine, scripted: ScriptedOutput, count: int
) -> AsyncIterator[list[list[float]]]:
    """`count` requests (`stream-<i>`) decoding forced tokens while the block runs: the times
    each one's tokens arrived. They are cancelled at the end of the block."""
    arrivals: list[list[float]] = [[] for _ in range(count)]

    async def stream(index: int) -> None:
        request = user_turn(f"stream-{index}", f"hi {index}", 30_000)
        async for event in engine.submit(request):
            if isinstance(event, TextDelta):
                arrivals[index].append(time.monotonic())

    for _ in range(count):
        scripted.enqueue(" ".join(f"w{i}" for i in range(8000)))  # forced, token by token
    streams = [asyncio.create_task(stream(i)) for i in range(count)]
    try:
        yield arrivals
    finally:
        for index in range(count):
            engine.cancel(f"stream-{index}")
        await asyncio.gather(*streams)


async def timed_prompt(engine: Engine, text: str) -> tuple[Admitted, float, float]:
    """`text` as a request of two tokens: its admission, when that came and when its first
    token came (0.0: none)."""
    admitted: Admitted | None = None
    admitted_at = first_token_at = 0.0
    async for event in engine.submit(user_turn("long", text, 2)):
        if isinstance(event, Admitted):
            admitted, admitted_at = event, time.monotonic()
        elif isinstance(event, TextDelta) and not first_token_at:
            first_token_at = time.monotonic()
    assert admitted is not None, "the prompt was never admitted"
    return admitted, admitted_at, first_token_at


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


@dataclass
class Served:
    """A live server (the app under uvicorn on a real socket, as `mlx serve` runs it) over a
    started engine, its output scripted at the model boundary (`scripted.enqueue`), with the
    real SDKs of both vendors as its clients; `client` is the one named by `sdk`."""

    engine: Engine
    server: ServerHandle
    scripted: ScriptedOutput
    token: str | None
    directory: Path  # the model's
    sdk: Literal["anthropic", "openai"] = "anthropic"

    @property
    def anthropic(self) -> anthropic.Anthropic:
        key = self.token or "x"
        return anthropic.Anthropic(base_url=self.server.url, api_key=key, max_retries=0)

    @property
    def openai(self) -> Any:  # untyped: tests send loose dicts
        key = self.token or "x"
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=key, max_retries=0)

    @property
    def client(self) -> Any:  # the SDK, untyped: tests send loose dicts
        return self.openai if self.sdk == "openai" else self.anthropic

    @functools.cached_property
    def tokenizer(self) -> TokenizerWrapper:
        return load_tokenizer(self.directory)

    def rendered(self, index: int = -1) -> str:
        """The prompt text of a request the engine generated for (the real renderer)."""
        return PromptRenderer(self.tokenizer).render_text(self.scripted.requests[index])

    def post(self, path: str, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
        """`body` (JSON, or raw bytes) to `path`, with the token (and `headers`)."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"authorization": f"Bearer {self.token}", "content-type": "application/json"}
        return httpx.post(
            self.server.url + path, content=content, headers={**sent, **headers}, timeout=300
        )


@contextmanager
def serve(
    model_dir: Path,
    *,
    token: str | None = None,
    sdk: Literal["anthropic", "openai"] = "anthropic",
    settings: dict[str, Any] | None = None,
    scripted: bool = True,
    **config: Any,
) -> Iterator[Served]:
    """A `Served` on `model_dir` for the block: `settings` are more ServerSettings fields,
    `config` more EngineConfig fields; `scripted=False` puts no hook at the model boundary
    (unless `config` brings a `logits_hook`). The server stops, then the engine closes."""
    script = ScriptedOutput()
    hook = config.pop("logits_hook", script if scripted else None)
    engine = Engine(EngineConfig(model=str(model_dir), logits_hook=hook, **config))
    engine.start()
    try:
        server = start_server(engine, ServerSettings(auth_token=token, **(settings or {})))
        try:
            yield Served(engine, server, script, token, model_dir, sdk)
        finally:
            server.stop()
    finally:
        engine.close()


@contextmanager
def served_engine(
    model_dir: Path, token: str, **config: Any
) -> Iterator[tuple[Engine, ServerHandle]]:
    """A started engine on `model_dir` (`config`: more EngineConfig fields, such as a
    `logits_hook` that scripts its output) behind a live server that wants `token`."""
    with serve(model_dir, token=token, scripted=False, **config) as served:
        yield served.engine, served.server


@contextmanager
def scripted_server(model_dir: Path, token: str) -> Iterator[Served]:
    """`serve` with a token: output scripted, both SDKs as clients."""
    with serve(model_dir, token=token) as served:
        yield served


class LogitsRecorder:
    """A logits processor that leaves the logits alone and records what it saw: the sequence's
    tokens so far (`context`), their number at the first step (`prompt_length`), and each
    step's largest logit and logsumexp (`steps`)."""

    def __init__(self) -> None:
        self.context: list[int] = []
        self.prompt_length: int | None = None
        self.steps: list[tuple[float, float]] = []

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.prompt_length is None:
            self.prompt_length = int(tokens.shape[0])
        self.steps.append((float(mx.max(logits).item()), float(mx.logsumexp(logits).item())))
        self.context = cast(list[int], tokens.tolist())
        return logits

    @property
    def first_logsumexp(self) -> float | None:
        return self.steps[0][1] if self.steps else None


def recording_hook(
    recorders: list[LogitsRecorder],
) -> Callable[[GenerationRequest, Any], list[LogitsRecorder]]:
    """A logits hook that gives each request a recorder of its own, appended to `recorders`."""

    def hook(request: GenerationRequest, tokenizer: Any) -> list[LogitsRecorder]:
        recorders.append(LogitsRecorder())
        return [recorders[-1]]

    return hook


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
