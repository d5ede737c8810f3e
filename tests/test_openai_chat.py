"""Chat Completions (`POST /v1/chat/completions`) and the OpenAI shape of `/v1/models`, with
the official `openai` SDK as the client against the real server, engine and tiny model.

The first tests need no model: the `call_…` id mapping, the `/v1/models` header rule and the
chunk state machine, whose reduction is the non-streaming answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from engine_helpers import BASH_CALL as CALL
from engine_helpers import BASH_FUNCTION as BASH
from engine_helpers import HI, Served, serve

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.tool_ids import client_tool_id, model_written_id
from mlxlaunch.engine.types import (
    Admitted,
    Done,
    EngineEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
    Usage,
)
from mlxlaunch.protocol.openai_chat import ChatCompletionRequest
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.chat_completions import ChatChunkStream
from mlxlaunch.server.chat_mapping import (
    client_call_id,
    engine_call_id,
    speaks_openai,
    to_generation_request,
)
from mlxlaunch.server.runner import start_server

TOKEN = "test-token-openai"
CHAT = "/v1/chat/completions"


# --- without a model -------------------------------------------------------------------------


def test_call_ids_map_back_to_the_id_the_model_wrote() -> None:
    written = client_tool_id("a1b2c3d4e")  # a call whose id the model wrote (Mistral)
    client = client_call_id(written)
    assert client.startswith("call_mx") and engine_call_id(client) == written
    assert model_written_id(engine_call_id(client)) == "a1b2c3d4e"
    fresh = client_tool_id(None)  # the model wrote none: an id of ours, kept as sent back
    assert client_call_id(fresh).startswith("call_")
    assert engine_call_id(client_call_id(fresh)) == client_call_id(fresh)
    assert engine_call_id("call_abc123") == "call_abc123"  # another server's id, as it is


def test_models_shape_follows_the_client() -> None:
    assert speaks_openai({"authorization": "Bearer x", "x-stainless-lang": "python"})
    assert speaks_openai({})
    assert not speaks_openai({"anthropic-version": "2023-06-01", "authorization": "Bearer x"})
    assert not speaks_openai({"x-api-key": "x"})


def _mapped(**body: Any) -> Any:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **body})
    return to_generation_request(request, request_id="chatcmpl-1", context_window=4096)


def test_request_mapping() -> None:
    gen = _mapped(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
            *HI,
        ],
        tools=[BASH, {"type": "web_search"}],  # an unknown tool type is ignored
        tool_choice="required",
        parallel_tool_calls=False,
        stop="END",
        max_completion_tokens=9,
        response_format={"type": "json_object"},
    )
    assert [(m.role, m.content) for m in gen.messages] == [
        ("system", "Be brief.\n\nUse tools."),
        ("user", "hi"),
    ]
    assert [t.name for t in gen.tools] == ["Bash"]
    assert (gen.tool_choice.mode, gen.tool_choice.parallel) == ("any", False)
    assert gen.stop_sequences == ["END"] and gen.max_tokens == 9
    assert gen.response_schema == {"type": "object"}
    assert _mapped().max_tokens == 4096  # no cap: the window (the engine lowers it to fit)
    named = _mapped(tools=[BASH], tool_choice={"type": "function", "function": {"name": "Bash"}})
    assert (named.tool_choice.mode, named.tool_choice.name) == ("tool", "Bash")


def test_tool_results_render_in_call_order_with_engine_ids() -> None:
    engine_ids = [client_tool_id("a1b2c3d4e"), client_tool_id("f5g6h7i8j")]
    calls = [
        {
            "id": client_call_id(engine_id),
            "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps({"command": str(n)})},
        }
        for n, engine_id in enumerate(engine_ids)
    ]
    gen = _mapped(
        messages=[
            *HI,
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[1]["id"], "content": "out-1"},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "out-0"},
        ]
    )
    assistant, first, second = gen.messages[1:]
    assert [c.id for c in assistant.tool_calls] == engine_ids
    assert [(first.tool_call_id, first.content), (second.tool_call_id, second.content)] == [
        (engine_ids[0], "out-0"),
        (engine_ids[1], "out-1"),
    ]


def _feed(stream: ChatChunkStream, events: list[EngineEvent]) -> list[dict[str, Any]]:
    return [chunk.model_dump(mode="json") for event in events for chunk in stream.feed(event)]


def test_chunks_and_their_reduction() -> None:
    stream = ChatChunkStream(completion_id="chatcmpl-1", model="m", created=1, include_usage=True)
    chunks = _feed(
        stream,
        [
            Admitted("r", prompt_tokens=10, cached_tokens=4, max_tokens=50),
            ThinkingDelta("Plan."),
            TextDelta("Checking."),
            ToolCallStart("toolu_abc", "Bash"),
            ToolInputDelta("toolu_abc", '{"command": '),
            ToolInputDelta("toolu_abc", '"ls"}'),
            ToolCallEvent("toolu_abc", "Bash", '{"command": "ls"}'),
            ToolCallEvent("toolu_def", "Bash", '{"command": "pwd"}'),  # arrives whole
            Done("tool_use", Usage(prompt_tokens=10, cached_tokens=4, output_tokens=7)),
        ],
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert {"reasoning_content": "Plan."} in deltas and {"content": "Checking."} in deltas
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert pieces[0] == {
        "index": 0,
        "id": "call_abc",
        "type": "function",
        "function": {"name": "Bash", "arguments": ""},
    }
    assert "".join(p["function"]["arguments"] for p in pieces if p["index"] == 0) == (
        '{"command": "ls"}'
    )
    assert pieces[-1]["id"] == "call_def" and pieces[-1]["function"]["name"] == "Bash"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 17
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}

    message = stream.completion().model_dump(mode="json")["choices"][0]["message"]
    assert message["content"] == "Checking." and message["reasoning_content"] == "Plan."
    arguments = [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]]
    assert arguments == [{"command": "ls"}, {"command": "pwd"}]


# --- the real server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    with serve(tiny_model_dir, token=TOKEN, sdk="openai") as server:
        yield server


def _stream(served: Served, **kwargs: Any) -> list[Any]:
    return list(served.client.chat.completions.create(stream=True, **kwargs))


def _openai_envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body  # OpenAI's envelope, not Anthropic's
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.slow
def test_text_non_streaming(served: Served) -> None:
    served.scripted.enqueue("Hello there.")
    completion = served.client.chat.completions.create(model="local-qwen", messages=HI)
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.model == "local-qwen"
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == "Hello there."
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.slow
def test_text_streaming(served: Served) -> None:
    served.scripted.enqueue("Hello there, streamed.")
    chunks = _stream(served, model="m", messages=HI, max_tokens=50)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there, streamed."
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked for


@pytest.mark.slow
def test_include_usage_ends_with_a_usage_chunk(served: Served) -> None:
    served.scripted.enqueue("Counted.")
    chunks = _stream(served, model="m", messages=HI, stream_options={"include_usage": True})
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens > 0 and last.usage.prompt_tokens > 0
    assert chunks[-2].choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_tool_round_trip_with_cached_prompt(served: Served) -> None:
    served.scripted.enqueue("Checking." + CALL)
    messages: list[Any] = [{"role": "user", "content": "list the files " * 20}]
    first = served.client.chat.completions.create(
        model="m", messages=messages, tools=[BASH], max_tokens=100
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "Bash"
    assert json.loads(call.function.arguments) == {"command": "ls"}

    served.scripted.enqueue("All done.")
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "file-a\nfile-b"},
    ]
    second = served.client.chat.completions.create(
        model="m", messages=messages, tools=[BASH], max_tokens=100
    )
    assert second.choices[0].message.content == "All done."
    assert second.choices[0].finish_reason == "stop"
    prompt = served.rendered()
    call_at = prompt.index('{"name": "Bash", "arguments": {"command": "ls"}}')
    result_at = prompt.index("<tool_response>\nfile-a\nfile-b\n</tool_response>")
    assert prompt.index("Checking.") < call_at < result_at < prompt.rindex("<|im_start|>assistant")
    engine_request = served.scripted.requests[-1]
    assistant, result = engine_request.messages[-2:]
    assert result.tool_call_id == assistant.tool_calls[0].id  # the result answers that call
    # The second turn starts with the first one's prompt: read from the prefix cache.
    usage = second.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.slow
def test_streamed_tool_call_reassembles_to_valid_json(served: Served) -> None:
    served.scripted.enqueue(CALL)
    chunks = _stream(served, model="m", messages=HI, tools=[BASH], max_tokens=100)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += piece.id or ""
            if piece.function is not None:
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "Bash"
    assert json.loads(calls[0]["arguments"]) == {"command": "ls"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The SDK's own accumulator builds the same call.
    served.scripted.enqueue("Checking." + CALL)
    with served.client.chat.completions.stream(
        model="m", messages=HI, tools=[BASH], max_tokens=100
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking." and final.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.id.startswith("call_") and json.loads(call.function.arguments) == {"command": "ls"}


@pytest.mark.slow
def test_reasoning_content_when_the_model_thinks(served: Served) -> None:
    served.scripted.enqueue("Plan the answer.\n</think>\n\nHello!")
    completion = served.client.chat.completions.create(
        model="m", messages=HI, reasoning_effort="high", max_tokens=50
    )
    message = completion.choices[0].message
    assert message.content == "Hello!"
    assert (message.model_extra or {}).get("reasoning_content") == "Plan the answer."
    served.scripted.enqueue("Plan the answer.\n</think>\n\nHello!")
    chunks = _stream(served, model="m", messages=HI, reasoning_effort="high", max_tokens=50)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    assert reasoning == "Plan the answer."


@pytest.mark.slow
def test_json_schema_response_format_gives_valid_json(served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for _ in range(3):  # sampled by the random model, held to the schema by the grammar
        completion = served.client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Answer in JSON."}],
            max_tokens=200,
            temperature=1.0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
        )
        assert completion.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(completion.choices[0].message.content or ""), schema)


@pytest.mark.slow
def test_client_mistakes_are_400_in_openai_envelope(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.chat.completions.create(model="m", messages=HI, n=2)
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "n"

    error = _openai_envelope(served.post(CHAT, b'{"model": "m", "messages": ['), 400)
    assert error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]

    unknown = [*HI, {"role": "tool", "tool_call_id": "call_nope", "content": "x"}]
    error = _openai_envelope(served.post(CHAT, {"model": "m", "messages": unknown}), 400)
    assert "call_nope" in error["message"]

    missing = served.post(CHAT, {"model": "m", "messages": [{"role": "user"}]})
    assert _openai_envelope(missing, 400)["param"] == "messages.0.content"


@pytest.mark.slow
def test_errors_name_the_chat_completions_fields(served: Served) -> None:
    bomb = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(ab{100}){200}"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": bomb}}
    body = {"model": "m", "messages": HI, "response_format": fmt}
    message = _openai_envelope(served.post(CHAT, body), 400)["message"]
    assert "response_format.json_schema.schema.properties.a.pattern" in message
    assert "output_config" not in message
    tool = {"type": "function", "function": {"name": "t", "parameters": bomb}}
    body = {"model": "m", "messages": HI, "tools": [tool], "tool_choice": "required"}
    message = _openai_envelope(served.post(CHAT, body), 400)["message"]
    assert "tools['t'].function.parameters.properties.a.pattern" in message
    body = {"model": "m", "messages": HI, "tool_choice": "required"}
    message = _openai_envelope(served.post(CHAT, body), 400)["message"]
    assert "'required'" in message and "'any'" not in message


@pytest.mark.slow
def test_missing_token_is_401_in_openai_envelope(served: Served) -> None:
    response = httpx.post(
        served.server.url + "/v1/chat/completions", json={"model": "m", "messages": HI}
    )
    error = _openai_envelope(response, 401)
    assert error["code"] == "invalid_api_key"
    wrong: Any = openai.OpenAI(base_url=served.server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="m", messages=HI)


@pytest.mark.slow
def test_models_through_both_sdks(served: Served) -> None:
    listing = served.client.models.list()
    (model,) = listing.data
    assert model.object == "model" and model.owned_by == "mlxlaunch"
    assert isinstance(model.created, int) and model.created > 0
    assert served.client.models.retrieve("gpt-x").id == "gpt-x"
    raw = httpx.get(served.server.url + "/v1/models", headers={"authorization": f"Bearer {TOKEN}"})
    assert raw.json()["object"] == "list"

    claude = anthropic.Anthropic(base_url=served.server.url, api_key=TOKEN, max_retries=0)
    (entry,) = claude.models.list().data
    assert entry.type == "model" and entry.id == model.id and entry.display_name == model.id
    assert claude.models.retrieve("claude-x").display_name == "claude-x"


@pytest.mark.slow
def test_client_disconnect_cancels_the_request(served: Served) -> None:
    import time

    before = served.engine.stats().counters.requests_cancelled
    served.scripted.enqueue(" word" * 3000)
    body = {"model": "m", "messages": HI, "max_tokens": 3000, "stream": True}
    with httpx.stream(
        "POST",
        served.server.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=60,
    ) as response:
        for line in response.iter_lines():
            if '"content":" word' in line:
                break  # leave mid-stream
    deadline = time.monotonic() + 10
    while served.engine.stats().counters.requests_cancelled == before:
        assert time.monotonic() < deadline, "the engine never saw the cancellation"
        time.sleep(0.05)
    served.scripted.enqueue("ok")
    again = served.client.chat.completions.create(model="m", messages=HI)
    assert again.choices[0].message.content == "ok"


@pytest.mark.slow
def test_refusals_keep_their_status(tiny_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir), context_length=64, max_queue=0))
    engine.start()
    server = start_server(engine, ServerSettings())
    client: Any = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    try:
        long_prompt = [{"role": "user", "content": "many words " * 100}]
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as too_long:
                client.chat.completions.create(model="m", messages=long_prompt, stream=stream)
            assert too_long.value.code == "context_length_exceeded"
            assert "prompt is too long" in too_long.value.message
            with pytest.raises(openai.RateLimitError) as busy:
                client.chat.completions.create(model="m", messages=HI, stream=stream)
            assert int(busy.value.response.headers["retry-after"]) >= 1
    finally:
        server.stop()
        engine.close()
