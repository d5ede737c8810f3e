"""`POST /v1/responses` through the real server, engine and tiny model, with the official
`openai` SDK as client: text streamed and not, a function-call round trip, usage with cached
tokens, json_schema output, Codex's tool list, errors in OpenAI's envelope, stored responses,
and a Codex-shaped session (the captured Codex 0.171 requests, growing by a function call and
its output per turn) reusing the previous turn's prompt from the prefix cache."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from engine_helpers import Served, serve

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    GenerationRequest,
    InvalidRequest,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
    Usage,
)
from mlxlaunch.protocol.openai_responses import ResponsesRequest
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.images import TEXT_ONLY
from mlxlaunch.server.responses_mapping import (
    client_call_id,
    engine_call_id,
    to_generation_request,
)
from mlxlaunch.server.responses_stream import ResponseStream, new_response

slow = pytest.mark.slow  # the tests that serve a model

FIXTURES = Path(__file__).parent / "fixtures" / "codex-0.171.0"
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    settings = {"threads_dir": tmp_path_factory.mktemp("responses") / "threads"}
    with serve(tiny_model_dir, sdk="openai", settings=settings) as server:
        yield server


@pytest.fixture(scope="module")
def strict(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with an auth token and a 64-token window."""
    settings = {"threads_dir": tmp_path_factory.mktemp("strict") / "threads"}
    with serve(
        tiny_model_dir, token="secret", sdk="openai", settings=settings, context_length=64
    ) as server:
        yield server


# --- text ---------------------------------------------------------------------------------


@slow
def test_non_streaming_text(served: Served) -> None:
    served.scripted.enqueue("Hello there!")
    response = served.client.responses.create(model="local", input="hi", store=False)
    assert response.status == "completed"
    assert response.output_text == "Hello there!"
    assert response.id.startswith("resp_")
    [item] = response.output
    assert item.type == "message" and item.id.startswith("msg_")
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@slow
def test_streaming_text_in_the_responses_grammar(served: Served) -> None:
    served.scripted.enqueue("Hello there!")
    with served.client.responses.stream(model="local", input="hi", store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.content_part.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == "Hello there!"


@slow
def test_max_output_tokens_makes_it_incomplete(served: Served) -> None:
    served.scripted.enqueue("one two three four five six seven eight nine ten")
    response = served.client.responses.create(
        model="local", input="count", max_output_tokens=3, store=False
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


@slow
def test_reasoning_streams_as_a_summary(served: Served) -> None:
    served.scripted.enqueue("Plan the answer.\n</think>\n\nHello!")
    with served.client.responses.stream(
        model="local", input="hi", reasoning={"summary": "auto"}, store=False
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_summary_text.delta" in kinds
    assert [item.type for item in final.output] == ["reasoning", "message"]
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.summary[0].text == "Plan the answer."
    assert final.output_text == "Hello!"


# --- function calls -----------------------------------------------------------------------


@slow
def test_function_call_round_trip(served: Served) -> None:
    client = served.client
    served.scripted.enqueue(CALL)
    with client.responses.stream(
        model="local", input="weather in Paris?", tools=[WEATHER], store=False
    ) as stream:
        events = list(stream)
        first = stream.get_final_response()
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(pieces) == json.loads(call.arguments) == {"city": "Paris"}

    served.scripted.enqueue("It is sunny in Paris.")
    history: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    answer = client.responses.create(model="local", input=history, tools=[WEATHER], store=False)
    assert answer.output_text == "It is sunny in Paris."
    usage = answer.usage
    assert usage is not None and first.usage is not None
    # The second turn reads the first turn's prompt from the prefix cache.
    assert usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8


@slow
def test_json_schema_output_is_valid_json(served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 20}},
        "required": ["title"],
        "additionalProperties": False,
    }
    response = served.client.responses.create(
        model="local",
        input="a title, please",
        text={"format": {"type": "json_schema", "name": "t", "schema": schema, "strict": True}},
        max_output_tokens=200,
        store=False,
    )
    assert response.status == "completed", response.incomplete_details
    assert isinstance(json.loads(response.output_text)["title"], str)


@slow
def test_codex_tools_are_accepted(served: Served) -> None:
    """Function, namespace and hosted tools (Codex's nine); a namespace tool's function is
    answered with its `name` and `namespace` apart, as Codex routes calls."""
    body = json.loads((FIXTURES / "responses-request-0.json").read_text())
    served.scripted.enqueue(
        '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "go"}}\n</tool_call>'
    )
    response = served.client.responses.create(
        model="local",
        input="spawn one",
        tools=body["tools"],
        store=False,
        max_output_tokens=100,
    )
    [call] = response.output
    assert call.type == "function_call" and call.name == "spawn_agent"
    assert getattr(call, "namespace", None) == "multi_agent_v1"


# --- errors -------------------------------------------------------------------------------


def _envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@slow
def test_bad_input_is_a_400_in_openai_envelope(served: Served) -> None:
    url = served.server.url + "/v1/responses"
    assert _envelope(httpx.post(url, json={"model": "m", "input": 42}), 400)["message"]
    orphan = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    error = _envelope(httpx.post(url, json={"model": "m", "input": orphan}), 400)
    assert "call_nope" in error["message"]
    with pytest.raises(openai.BadRequestError):
        served.client.responses.create(model="m", input=[{"role": "robot", "content": "x"}])
    image = [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]
    error = _envelope(
        httpx.post(url, json={"model": "m", "input": [{"role": "user", "content": image}]}), 400
    )
    assert "does not accept images" in error["message"]


BOMB_PATTERN = "(ab{100}){200}"  # expands past the pattern limit


def _string_with(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}


@slow
def test_errors_name_the_responses_fields(served: Served) -> None:
    url = served.server.url + "/v1/responses"
    fmt = {"type": "json_schema", "name": "x", "schema": _string_with(BOMB_PATTERN)}
    body = {"model": "m", "input": "hi", "text": {"format": fmt}}
    message = _envelope(httpx.post(url, json=body), 400)["message"]
    assert "text.format.schema.properties.a.pattern" in message
    assert "output_config" not in message
    tool = {"type": "function", "name": "t", "parameters": _string_with(BOMB_PATTERN)}
    body = {"model": "m", "input": "hi", "tools": [tool], "tool_choice": "required"}
    message = _envelope(httpx.post(url, json=body), 400)["message"]
    assert "tools['t'].parameters.properties.a.pattern" in message
    assert "input_schema" not in message
    body = {"model": "m", "input": "hi", "tool_choice": "required"}
    message = _envelope(httpx.post(url, json=body), 400)["message"]
    assert "'required'" in message and "'any'" not in message


@slow
def test_too_long_and_unauthorized(strict: Served) -> None:
    url = strict.server.url + "/v1/responses"
    long_input = {"model": "m", "input": "many words " * 100}
    for stream in (False, True):
        response = httpx.post(
            url, json={**long_input, "stream": stream}, headers={"authorization": "Bearer secret"}
        )
        error = _envelope(response, 400)
        assert error["code"] == "context_length_exceeded"
        assert error["type"] == "invalid_request_error"
    error = _envelope(httpx.post(url, json={"model": "m", "input": "hi"}), 401)
    assert error["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=strict.server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(model="m", input="hi")


# --- stored responses ---------------------------------------------------------------------


@slow
def test_previous_response_id_continues(served: Served) -> None:
    client = served.client
    served.scripted.enqueue(CALL)
    first = client.responses.create(model="local", input="weather in Paris?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call"
    served.scripted.enqueue("Sunny.")
    second = client.responses.create(
        model="local",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
    )
    assert second.output_text == "Sunny."
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="local", previous_response_id="resp_unknown", input="hi")
    assert refused.value.code == "previous_response_not_found"


# --- a Codex session ----------------------------------------------------------------------


def _codex_turn(served: Served, body: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """One streamed Codex request: (the output items, the usage of response.completed)."""
    response = httpx.post(served.server.url + "/v1/responses", json=body, timeout=300)
    assert response.status_code == 200, response.text
    frames = list(parse_frames(response.text))
    done = [f.json() for f in frames if f.event == "response.completed"]
    assert len(done) == 1, [f.event for f in frames][-3:]
    items = [f.json()["item"] for f in frames if f.event == "response.output_item.done"]
    return items, done[0]["response"]["usage"]


@slow
def test_codex_session_reuses_the_previous_prompt(served: Served) -> None:
    """Request 0 as Codex sent it, then turns built as Codex builds request 1: the model's
    function call and its output appended. Each turn reads ≥ 99% of the previous turn's
    prompt from the prefix cache."""
    body = json.loads((FIXTURES / "responses-request-0.json").read_text())
    reused: list[float] = []
    figures: list[tuple[int, int]] = []  # (prompt, cached) per turn
    previous_prompt = 0
    for turn in range(4):
        served.scripted.enqueue(
            f"Turn {turn}: run it.\n</think>\n\n<tool_call>\n"
            f'{{"name": "exec_command", "arguments": {{"cmd": "echo {turn}"}}}}\n</tool_call>'
        )
        items, usage = _codex_turn(served, body)
        figures.append((usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]))
        if previous_prompt:
            cached = usage["input_tokens_details"]["cached_tokens"]
            reused.append(cached / previous_prompt)
        previous_prompt = usage["input_tokens"]
        assert [item["type"] for item in items] == ["reasoning", "function_call"]
        call = items[-1]
        assert call["name"] == "exec_command" and json.loads(call["arguments"])
        body = copy.deepcopy(body)
        body["input"] += [
            {
                "type": "reasoning",
                "summary": items[0]["summary"],
                "content": None,
                "encrypted_content": None,
            },
            {
                "status": "completed",
                **{k: call[k] for k in ("type", "id", "name", "arguments", "call_id")},
            },
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": f"Process exited with code 0\nOutput:\n{turn}\n",
            },
        ]
    print("(prompt, cached) per turn:", figures)
    print("per-turn reuse of the previous prompt:", [f"{r:.4f}" for r in reused])
    assert all(r >= 0.99 for r in reused), reused


# --- the mapping and the event state machine, without a server ----------------------------


def _request(**body: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **body})


def test_call_ids_map_both_ways() -> None:
    assert client_call_id("toolu_mx6162") == "call_mx6162"
    assert engine_call_id("call_mx6162") == "toolu_mx6162"
    assert engine_call_id("fc-other-server") == "fc-other-server"


def test_codex_history_maps_to_chat_messages() -> None:
    body = json.loads((FIXTURES / "responses-request-1.json").read_text())
    request = ResponsesRequest.model_validate(body)
    gen, names = to_generation_request(
        request,
        request.items,
        request_id="resp_1",
        images=TEXT_ONLY,
        thinks=True,
        context_window=40960,
    )
    # Two developer messages: one system prompt; then the user turns, the call, its output.
    assert [m.role for m in gen.messages] == ["system", "user", "user", "assistant", "tool"]
    call = gen.messages[3].tool_calls[0]
    assert call.id == "toolu_f40689eb" and call.name == "exec_command"
    assert call.arguments == {"cmd": "echo tool-roundtrip-ok && uname -s"}
    assert gen.messages[4].tool_call_id == call.id
    assert gen.thinking and gen.kind == "main"
    # Function and namespace tools flattened; web_search not offered (no search backend).
    tool_names = {tool.name for tool in gen.tools}
    assert {"exec_command", "spawn_agent", "update_goal"} <= tool_names
    assert len(tool_names) == len(gen.tools) == 12  # 7 functions, 5 in the namespace
    assert names.for_client("spawn_agent") == ("multi_agent_v1", "spawn_agent")


def test_reasoning_joins_the_assistant_turn_it_precedes() -> None:
    request = _request(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Rules."},
            {"role": "user", "content": "go"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Think."}]},
            {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_b", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_b", "output": "B"},
            {"type": "function_call_output", "call_id": "call_a", "output": "A"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Done."}],
            },
        ],
    )
    gen, _ = to_generation_request(
        request,
        request.items,
        request_id="r",
        images=TEXT_ONLY,
        thinks=True,
        context_window=None,
    )
    system, user, calls, first, second, answer = gen.messages
    assert system.content == "Be brief.\n\nRules." and user.content == "go"
    assert calls.reasoning == "Think." and [c.id for c in calls.tool_calls] == [
        "toolu_a",
        "toolu_b",
    ]
    assert (first.content, second.content) == ("A", "B")  # in the order of the calls
    assert answer.role == "assistant" and answer.content == "Done."


def test_stream_events_for_reasoning_and_a_streamed_call() -> None:
    request = _request(input="x", tools=[WEATHER])
    _, names = to_generation_request(
        request,
        request.items,
        request_id="r",
        images=TEXT_ONLY,
        thinks=True,
        context_window=None,
    )
    stream = ResponseStream(new_response("resp_x", "m"), names)
    events = []
    for event in (
        Admitted("r", prompt_tokens=10, cached_tokens=4, max_tokens=100),
        ThinkingDelta("Hm."),
        ToolCallStart("toolu_7", "get_weather"),
        ToolInputDelta("toolu_7", '{"city": '),
        ToolInputDelta("toolu_7", '"Paris"}'),
        ToolCallEvent("toolu_7", "get_weather", '{"city": "Paris"}'),
        Done("tool_use", Usage(prompt_tokens=10, cached_tokens=4, output_tokens=9)),
    ):
        events += stream.feed(event)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = stream.response
    call = final.output[1]
    assert call.type == "function_call" and call.call_id == "call_7"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.status == "completed"
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 4


def test_a_failure_mid_stream_ends_with_response_failed() -> None:
    stream = ResponseStream(
        new_response("resp_x", "m"),
        names=to_generation_request(
            _request(input="x"),
            [],
            request_id="r",
            images=TEXT_ONLY,
            thinks=False,
            context_window=None,
        )[1],
    )
    stream.feed(Admitted("r", prompt_tokens=3, cached_tokens=0, max_tokens=10))
    events = stream.fail("server_error", "generation failed: boom")
    assert events[-1].type == "response.failed" and stream.finished
    assert stream.response.error is not None and stream.response.error.message.endswith("boom")


def test_a_failing_stream_with_unreadable_arguments_still_ends_with_response_failed() -> None:
    """The error path closes the open call; arguments no reader holds (an integer past
    int()'s limit) used to raise again there, so the stream just stopped (Codex retries)."""
    from mlxlaunch.server.responses_mapping import ToolNames

    stream = ResponseStream(new_response("resp_x", "m"), ToolNames())
    stream.feed(ToolCallStart("toolu_1", "t"))
    stream.feed(ToolInputDelta("toolu_1", '{"n": ' + "7" * 5000 + "}"))
    events = stream.fail("server_error", "boom")
    assert events[-1].type == "response.failed" and stream.response.status == "failed"
    [call] = stream.response.output
    assert call.type == "function_call" and call.arguments == "{}"


# --- what Codex sends ---------------------------------------------------------------------


@slow
def test_a_history_that_opens_with_the_assistant_is_served(served: Served) -> None:
    served.scripted.enqueue("Yes.")
    history = [
        {"role": "assistant", "content": [{"type": "output_text", "text": "How can I help?"}]},
        {"role": "user", "content": "Is it sunny?"},
    ]
    response = served.client.responses.create(model="local", input=history, store=False)
    assert response.output_text == "Yes."
    served.scripted.enqueue("Still here.")
    alone = [{"role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]}]
    response = served.client.responses.create(model="local", input=alone, store=False)
    assert response.output_text == "Still here."


@slow
def test_server_side_call_items_are_dropped_with_a_warning(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    search = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "weather Paris"},
    }
    history = [
        {"role": "user", "content": "Search the weather."},
        search,
        {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "AAAA"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"role": "user", "content": "Thanks."},
    ]
    for stream in (False, True):
        served.scripted.enqueue("You're welcome.")
        body = {"model": "m", "input": history, "store": False, "stream": stream}
        response = httpx.post(served.server.url + "/v1/responses", json=body, timeout=60)
        assert response.status_code == 200, response.text
    assert "web_search_call" in caplog.text and "image_generation_call" in caplog.text


def _mapped(items: list[dict[str, Any]], **body: Any) -> GenerationRequest:
    request = _request(input=items, **body)
    gen, _ = to_generation_request(
        request,
        request.items,
        request_id="r",
        images=TEXT_ONLY,
        thinks=False,
        context_window=None,
    )
    return gen


def test_local_shell_items_are_a_shell_call_and_its_result() -> None:
    action = {"type": "exec", "command": ["bash", "-lc", "ls"], "working_directory": "/w"}
    call = {"type": "local_shell_call", "id": "ls_1", "call_id": "call_s", "action": action}
    for output in (
        {"type": "local_shell_call_output", "id": "call_s", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "call_s", "output": "a.txt"},  # Codex's form
    ):
        gen = _mapped([call, output])
        assistant, result = gen.messages
        [record] = assistant.tool_calls
        assert record.name == "shell" and record.id == "toolu_s"
        assert record.arguments == {"command": ["bash", "-lc", "ls"], "workdir": "/w"}
        assert result.role == "tool" and result.tool_call_id == "toolu_s"
        assert result.content == "a.txt"
    # Without a call_id the item's id names the call.
    unnamed = {**call, "call_id": None}
    gen = _mapped([unnamed, {"type": "local_shell_call_output", "id": "ls_1", "output": "x"}])
    assert gen.messages[0].tool_calls[0].id == gen.messages[1].tool_call_id == "ls_1"
    with pytest.raises(InvalidRequest, match="local_shell_call with call_id 'nope'"):
        _mapped([call, {"type": "local_shell_call_output", "id": "nope", "output": "x"}])


def test_namespaced_mcp_calls_keep_their_names() -> None:
    tools = [
        {"type": "function", "name": "mcp__fs__read", "parameters": {"type": "object"}},
        {
            "type": "namespace",
            "name": "mcp__git",
            "description": "git server",
            "tools": [{"type": "function", "name": "log", "parameters": {"type": "object"}}],
        },
    ]
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "call_1", "name": "mcp__fs__read", "arguments": "{}"},
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "log",
            "namespace": "mcp__git",
            "arguments": '{"n": 1}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "file"},
        {"type": "function_call_output", "call_id": "call_2", "output": "commit"},
    ]
    gen = _mapped(items, tools=tools)
    assert [c.name for c in gen.messages[1].tool_calls] == ["mcp__fs__read", "log"]
    assert {t.name for t in gen.tools} == {"mcp__fs__read", "log"}


def test_a_compaction_item_is_refused_by_name() -> None:
    sealed = {"type": "compaction", "encrypted_content": "gAAAA"}
    with pytest.raises(InvalidRequest, match=r"input\.1: a compaction item"):
        _mapped([{"role": "user", "content": "go"}, sealed])


@slow
def test_a_history_of_local_shell_calls_is_served(served: Served) -> None:
    action = {"type": "exec", "command": ["ls"]}
    history = [
        {"type": "local_shell_call", "call_id": "call_s", "status": "completed", "action": action},
        {"type": "local_shell_call_output", "id": "call_s", "output": "a.txt"},
    ]
    served.scripted.enqueue("There is a.txt.")
    response = served.client.responses.create(model="local", input=history, store=False)
    assert response.output_text == "There is a.txt."
    url = served.server.url + "/v1/responses"
    sealed = [{"role": "user", "content": "go"}, {"type": "compaction", "encrypted_content": "x"}]
    error = _envelope(httpx.post(url, json={"model": "m", "input": sealed}), 400)
    assert "compaction" in error["message"]


def test_custom_tool_calls_in_the_history_render_as_a_call_with_its_text() -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    items = [
        {"role": "user", "content": "add a.txt"},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": patch},
        {
            "type": "custom_tool_call_output",
            "call_id": "call_p",
            "output": [{"type": "input_text", "text": "Success."}],
        },
    ]
    _, assistant, result = _mapped(items).messages
    [record] = assistant.tool_calls
    assert (record.name, record.arguments) == ("apply_patch", {"input": patch})
    assert result.tool_call_id == record.id == "toolu_p" and result.content == "Success."
    orphan = {"type": "custom_tool_call_output", "call_id": "call_x", "output": "?"}
    with pytest.raises(InvalidRequest, match="no custom_tool_call with call_id 'call_x'"):
        _mapped([items[0], orphan])


@slow
def test_prompt_cache_key_shows_in_stats(served: Served) -> None:
    served.scripted.enqueue("Keyed.")
    served.client.responses.create(
        model="local", input="hi", store=False, prompt_cache_key="conv-7f3a"
    )
    recent = httpx.get(served.server.url + "/v1/stats").json()["recent"]
    assert any(r["cache_key"] == "conv-7f3a" for r in recent), recent
    url = served.server.url + "/v1/responses"
    huge = {"model": "m", "input": "hi", "prompt_cache_key": "k" * 100_000}
    assert "prompt_cache_key" in _envelope(httpx.post(url, json=huge), 400)["message"]
