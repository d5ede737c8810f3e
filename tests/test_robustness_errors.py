"""Robustness III (issue 35), items 7-10: errors that were 5xx or misled, through the real
server with the real `anthropic` and `openai` SDKs as clients, on all three APIs.

The model's side is scripted at the model boundary (`ScriptedOutput`): the point is how the
server handles the text a model writes, so the tokenizer, the output parser, the state
machines and the SDKs' own stream readers all run for real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from engine_helpers import served_engine

from mlxlaunch.engine.output.parser import INCOMPLETE_KEY
from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here serves a model

TOKEN = "errors-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {}}}
ANTHROPIC_TOOL = {"name": "t", "description": "d", "input_schema": SCHEMA}
FUNCTION = {"name": "t", "description": "d", "parameters": SCHEMA}
CHAT_TOOL = {"type": "function", "function": FUNCTION}
RESPONSES_TOOL = {"type": "function", **FUNCTION}


@dataclass
class Served:
    server: ServerHandle
    scripted: ScriptedOutput

    @property
    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.server.url, api_key=TOKEN, max_retries=0)

    @property
    def openai(self) -> Any:  # untyped: tests send loose dicts
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=TOKEN, max_retries=0)

    def post(self, path: str, body: bytes | dict[str, Any]) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(self.server.url + path, content=content, headers=HEADERS, timeout=300)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    scripted = ScriptedOutput()
    with served_engine(tiny_model_dir, TOKEN, logits_hook=scripted) as (_, handle):
        yield Served(handle, scripted)


def qwen_call(arguments: str) -> str:
    """A call in the tiny model's (qwen) syntax, with `arguments` as the model writes them."""
    return '<tool_call>\n{"name": "t", "arguments": ' + arguments + "}\n</tool_call>"


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# --- item 7: a call the model writes with a value no reader holds ---------------------------

UNHOLDABLE = {
    "huge-int": '{"n": ' + "7" * 5000 + "}",  # past int()'s 4,300 digits
    "huge-float": '{"n": 1e400}',  # Python's inf, which JSON cannot write
    "deep": '{"n": ' + _deep(100) + "}",  # past jiter's 200 levels once a client nests it
}


def _assert_refusable(arguments: dict[str, Any]) -> None:
    """What the client gets: the call, valid JSON it holds, flagged so that a strict schema
    refuses it (the model is told), never a 500 or a dead stream."""
    assert INCOMPLETE_KEY in arguments
    json.dumps(arguments, allow_nan=False)


@pytest.mark.parametrize("arguments", list(UNHOLDABLE.values()), ids=list(UNHOLDABLE))
def test_an_unholdable_call_is_answered_on_all_three_apis(served: Served, arguments: str) -> None:
    call = qwen_call(arguments)
    messages = [{"role": "user", "content": "go"}]

    served.scripted.enqueue(call)
    message = served.anthropic.messages.create(
        model="m", max_tokens=8000, messages=messages, tools=[ANTHROPIC_TOOL]
    )
    [block] = message.content
    assert block.type == "tool_use" and message.stop_reason == "tool_use"
    _assert_refusable(block.input)
    served.scripted.enqueue(call)
    with served.anthropic.messages.stream(
        model="m", max_tokens=8000, messages=messages, tools=[ANTHROPIC_TOOL]
    ) as stream:  # the SDK's accumulator parses the streamed input with jiter
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use"
    _assert_refusable(final.content[0].input)

    served.scripted.enqueue(call)
    completion = served.openai.chat.completions.create(
        model="m", messages=messages, tools=[CHAT_TOOL]
    )
    [chat_call] = completion.choices[0].message.tool_calls
    _assert_refusable(json.loads(chat_call.function.arguments))
    served.scripted.enqueue(call)
    chunks = list(
        served.openai.chat.completions.create(
            model="m", messages=messages, tools=[CHAT_TOOL], stream=True
        )
    )
    streamed = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    )
    _assert_refusable(json.loads(streamed))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    served.scripted.enqueue(call)
    response = served.openai.responses.create(
        model="m", input="go", tools=[RESPONSES_TOOL], store=False
    )
    [item] = response.output
    assert item.type == "function_call" and response.status == "completed"
    _assert_refusable(json.loads(item.arguments))
    served.scripted.enqueue(call)
    with served.openai.responses.stream(
        model="m", input="go", tools=[RESPONSES_TOOL], store=False
    ) as events:
        kinds = [event.type for event in events]
        done = events.get_final_response()
    assert kinds[-1] == "response.completed"
    _assert_refusable(json.loads(done.output[0].arguments))

    # The conversation goes on: the call, sent back as history, is a request like any other.
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [chat_call.model_dump()]},
        {"role": "tool", "tool_call_id": chat_call.id, "content": "refused"},
    ]
    served.scripted.enqueue("ok")
    again = served.openai.chat.completions.create(model="m", messages=history, tools=[CHAT_TOOL])
    assert again.choices[0].message.content == "ok"
