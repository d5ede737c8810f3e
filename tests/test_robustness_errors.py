"""Robustness III (issue 35), items 7-10: errors that were 5xx or misled, through the real
server with the real `anthropic` and `openai` SDKs as clients, on all three APIs.

The model's side is scripted at the model boundary (`ScriptedOutput`): the point is how the
server handles the text a model writes, so the tokenizer, the output parser, the state
machines and the SDKs' own stream readers all run for real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import Served, scripted_server

from mlxlaunch.engine.output.parser import INCOMPLETE_KEY

pytestmark = pytest.mark.slow  # every test here serves a model

TOKEN = "errors-token"
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {}}}
ANTHROPIC_TOOL = {"name": "t", "description": "d", "input_schema": SCHEMA}
FUNCTION = {"name": "t", "description": "d", "parameters": SCHEMA}
CHAT_TOOL = {"type": "function", "function": FUNCTION}
RESPONSES_TOOL = {"type": "function", **FUNCTION}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    with scripted_server(tiny_model_dir, TOKEN) as server:
        yield server


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


# --- item 8: history arguments past the request limits; a schema whose lexer explodes -------

HOSTILE_ARGUMENTS = {
    "huge-int": '{"n": ' + "7" * 5000 + "}",
    "deep": '{"n": ' + _deep(100_000) + "}",
}


@pytest.mark.parametrize("arguments", list(HOSTILE_ARGUMENTS.values()), ids=list(HOSTILE_ARGUMENTS))
def test_history_arguments_past_the_request_limits_are_a_400(
    served: Served, arguments: str
) -> None:
    """As the same call inside a Messages body already is (its `input` is parsed with the
    body, under protocol/limits.py); it was a 500 on Chat Completions and Responses."""
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "t", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
    }
    responses = {
        "model": "m",
        "store": False,
        "input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "call_1", "name": "t", "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        ],
    }
    for path, body, field in (
        ("/v1/chat/completions", chat, "messages.1.tool_calls.0.function.arguments"),
        ("/v1/responses", responses, "input.1.arguments"),
    ):
        for stream in (False, True):
            answer = served.post(path, {**body, "stream": stream})
            assert answer.status_code == 400, (path, answer.text[:300])
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and field in error["message"]
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": "__INPUT__"}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}],
        },
    ]
    raw = json.dumps({"model": "m", "max_tokens": 4, "messages": messages})
    answer = served.post("/v1/messages", raw.replace('"__INPUT__"', arguments).encode())
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"


# A lexer that needs 2^101 states (it must remember which of the last 100 characters was an
# `a`): admitted, then "too many states" on the worker once sampling explored it.
EXPLODING = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^.*a.{100}$"}}}


def test_a_schema_whose_lexer_explodes_is_a_400_before_admission(served: Served) -> None:
    strict_tool = {**ANTHROPIC_TOOL, "input_schema": EXPLODING, "strict": True}
    chat_tool = {
        "type": "function",
        "function": {**FUNCTION, "parameters": EXPLODING, "strict": True},
    }
    responses_tool = {"type": "function", **FUNCTION, "parameters": EXPLODING, "strict": True}
    user = [{"role": "user", "content": "go"}]
    fmt = {"type": "json_schema", "schema": EXPLODING}
    named_fmt = {"type": "json_schema", "name": "x", "schema": EXPLODING}
    cases = [
        ("/v1/messages", {"max_tokens": 8, "messages": user, "output_config": {"format": fmt}}),
        ("/v1/messages", {"max_tokens": 8, "messages": user, "tools": [strict_tool]}),
        (
            "/v1/chat/completions",
            {"messages": user, "tools": [chat_tool], "tool_choice": "required"},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": user,
                "response_format": {"type": "json_schema", "json_schema": named_fmt},
            },
        ),
        ("/v1/responses", {"input": "go", "tools": [responses_tool], "store": False}),
        ("/v1/responses", {"input": "go", "text": {"format": named_fmt}, "store": False}),
    ]
    admitted = len(served.scripted.requests)
    for path, body in cases:
        for stream in (False, True):
            answer = served.post(path, {"model": "m", **body, "stream": stream})
            assert answer.status_code == 400, (path, stream, answer.text[:300])
            assert "pattern too complex" in answer.text and ".pattern" in answer.text
    assert len(served.scripted.requests) == admitted  # none reached generation


# --- item 9: what a client chose is bounded where it is echoed or logged ---------------------


def test_a_huge_previous_response_id_is_a_short_400(served: Served) -> None:
    huge = "resp_" + "x" * (4 << 20)
    answer = served.post(
        "/v1/responses", {"model": "m", "input": "go", "previous_response_id": huge}
    )
    assert answer.status_code == 400
    assert len(answer.content) < 2_000  # was the 4 MB id, echoed
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "previous_response_id" in error["message"]
    unknown = served.post(
        "/v1/responses", {"model": "m", "input": "go", "previous_response_id": "resp_" + "x" * 200}
    )
    assert (
        unknown.status_code == 400
        and unknown.json()["error"]["code"] == "previous_response_not_found"
    )


def test_tools_inside_namespaces_count_toward_the_tool_limit(served: Served) -> None:
    from mlxlaunch.protocol.limits import MAX_TOOLS

    def namespace(name: str, count: int) -> dict[str, Any]:
        members = [{"type": "function", "name": f"f{i}"} for i in range(count)]
        return {"type": "namespace", "name": name, "tools": members}

    for tools in (
        [namespace("a", MAX_TOOLS + 1)],
        [namespace("a", MAX_TOOLS // 2 + 1), namespace("b", MAX_TOOLS // 2)],
        [namespace("a", MAX_TOOLS), RESPONSES_TOOL],
    ):
        answer = served.post("/v1/responses", {"model": "m", "input": "go", "tools": tools})
        assert answer.status_code == 400, answer.text[:300]
        assert f"at most {MAX_TOOLS}" in answer.json()["error"]["message"]
    served.scripted.enqueue("ok")
    fits = served.post(
        "/v1/responses",
        {"model": "m", "input": "go", "store": False, "tools": [namespace("a", MAX_TOOLS)]},
    )
    assert fits.status_code == 200, fits.text[:300]


def test_client_chosen_strings_reach_the_log_bounded(served: Served, tmp_path: Path) -> None:
    """One request's 22 MB `type` was logged whole; here 2 MB, in every place a type or a
    name reaches a log line on the three APIs."""
    from mlxlaunch.launch.server_log import logging_to

    big = "T" * (2 << 20)
    log_file = tmp_path / "server.log"
    with logging_to(log_file):
        served.scripted.enqueue("ok")
        served.post(
            "/v1/responses",
            {
                "model": "m",
                "store": False,
                "tools": [
                    {"type": big},
                    {"type": "namespace", "name": "n", "tools": [{"type": big}]},
                ],
                "input": [
                    {"type": big},
                    {
                        "role": "user",
                        "content": [{"type": big}, {"type": "input_text", "text": "go"}],
                    },
                ],
            },
        )
        served.scripted.enqueue("ok")
        served.post(
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "go"}],
                "tools": [{"type": big}],
            },
        )
        for body in (
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [{"type": big}]}],
            },
            {"model": "m", "messages": [{"role": "user", "content": [{"type": big}]}]},
        ):
            for path in ("/v1/messages", "/v1/chat/completions", "/v1/responses"):
                served.post(path, body)  # refused: the type is unknown (or the body is wrong)
    assert log_file.stat().st_size < 64_000, log_file.stat().st_size
    assert "chars)" in log_file.read_text()  # shortened, saying so


def test_a_refusal_is_one_log_line_on_every_api(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="mlxlaunch.server")
    for path in ("/v1/messages", "/v1/chat/completions", "/v1/responses"):
        for body in (b"{nope", {"model": "m", "max_tokens": -1, "input": 5, "messages": 5}):
            caplog.clear()
            assert served.post(path, body).status_code == 400
            lines = [r.getMessage() for r in caplog.records if r.name == "mlxlaunch.server"]
            refused = [
                line for line in lines if line.startswith(f"POST {path} refused: status=400 ")
            ]
            assert len(refused) == 1, (path, lines)
    caplog.clear()
    unauthorized = httpx.post(served.server.url + "/v1/responses", json={}, timeout=30)
    assert unauthorized.status_code == 401
    assert any("refused: status=401" in r.getMessage() for r in caplog.records)
