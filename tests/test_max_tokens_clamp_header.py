"""The clamp header on every API: when the engine lowers `max_tokens` to what fits in the
context window, the answer says so in `x-mlx-max-tokens-clamped`, streamed or whole.

The three APIs share one drive loop (server/streaming.py); before it, the Responses API sent
no clamp header. A real uvicorn server over the real engine on the tiny model; scripted
output runs until the cap, so the tokens generated are the clamped cap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.server.settings import ServerSettings
from mlxlaunch.server.streaming import CLAMPED_HEADER
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # serves a model

WINDOW = 96
LONG = " ".join(f"w{i}" for i in range(3000))  # more tokens than the window lets through


def messages(cap: int, stream: bool) -> dict[str, Any]:
    return {"model": "m", "max_tokens": cap, "stream": stream,
            "messages": [{"role": "user", "content": "hello there"}]}  # fmt: skip


def chat(cap: int, stream: bool) -> dict[str, Any]:
    return {"model": "m", "max_tokens": cap, "stream": stream,
            "messages": [{"role": "user", "content": "hello there"}]}  # fmt: skip


def responses(cap: int, stream: bool) -> dict[str, Any]:
    return {"model": "m", "max_output_tokens": cap, "stream": stream, "store": False,
            "input": "hello there"}  # fmt: skip


# path, request body, and where the whole answer reports the tokens it generated
APIS: dict[str, tuple[str, Callable[[int, bool], dict[str, Any]], Callable[[Any], int]]] = {
    "messages": ("/v1/messages", messages, lambda a: a["usage"]["output_tokens"]),
    "chat": ("/v1/chat/completions", chat, lambda a: a["usage"]["completion_tokens"]),
    "responses": ("/v1/responses", responses, lambda a: a["usage"]["output_tokens"]),
}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[tuple[ServerHandle, ScriptedOutput]]:
    scripted = ScriptedOutput()
    engine = Engine(
        EngineConfig(model=str(tiny_model_dir), logits_hook=scripted, context_length=WINDOW)
    )
    engine.start()
    handle = start_server(engine, ServerSettings())
    yield handle, scripted
    handle.stop()
    engine.close()


@pytest.mark.parametrize("api", list(APIS))
def test_a_clamped_cap_is_in_the_header_streamed_and_whole(
    server: tuple[ServerHandle, ScriptedOutput], api: str
) -> None:
    handle, scripted = server
    path, body, generated = APIS[api]
    with httpx.Client(base_url=handle.url, timeout=60) as client:
        scripted.enqueue(LONG)
        whole = client.post(path, json=body(1000, False))
        assert whole.status_code == 200, whole.text
        clamped = int(whole.headers[CLAMPED_HEADER])
        assert 0 < clamped < 1000
        assert generated(whole.json()) == clamped  # the cap the engine ran with
        scripted.enqueue(LONG)
        with client.stream("POST", path, json=body(1000, True)) as streamed:
            assert streamed.status_code == 200
            streamed.read()
            assert streamed.headers[CLAMPED_HEADER] == str(clamped)
        scripted.enqueue(LONG)
        fits = client.post(path, json=body(3, False))
        assert fits.status_code == 200, fits.text
        assert CLAMPED_HEADER not in fits.headers
