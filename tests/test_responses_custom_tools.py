"""Freeform `custom` tools on the Responses API (Codex's `apply_patch`): offered to the model as
a tool with one string parameter `input`, answered as `custom_tool_call` items whose `input` is
the raw text, streamed as `response.custom_tool_call_input.delta` pieces; and on Chat
Completions, as `{"type": "custom", "custom": {...}}` tools and calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from engine_helpers import Served, serve
from test_custom_tool_grammars import BOUNDED_LARK, patch_hunks

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    InputGrammar,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
    Usage,
)
from mlxlaunch.protocol.openai_chat import ChatCompletionRequest
from mlxlaunch.protocol.openai_responses import ResponsesRequest
from mlxlaunch.server.call_arguments import StringArgumentStream
from mlxlaunch.server.chat_completions import ChatChunkStream
from mlxlaunch.server.chat_mapping import to_generation_request as chat_request
from mlxlaunch.server.images import TEXT_ONLY
from mlxlaunch.server.responses_mapping import to_generation_request
from mlxlaunch.server.responses_stream import ResponseStream, new_response
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import real_template_family

slow = pytest.mark.slow  # the tests that serve a model

FIXTURES = Path(__file__).parent / "fixtures"
APPLY_PATCH_LARK = (FIXTURES / "apply_patch.lark").read_text()
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_LARK},
}
NOTE: dict[str, Any] = {"type": "custom", "name": "note", "format": {"type": "text"}}
PATCH = '*** Begin Patch\n*** Add File: a.py\n+print("hi\\\\n")\n*** End Patch\n'


def _mapped(**body: Any) -> Any:
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", **body})
    return to_generation_request(
        request, request.items, request_id="r", images=TEXT_ONLY, thinks=False, context_window=None
    )


def test_a_custom_tool_is_offered_as_one_string_parameter() -> None:
    gen, names = _mapped(tools=[NOTE, APPLY_PATCH])
    note, patch = gen.tools
    for spec in (note, patch):
        assert spec.parameters["properties"] == {"input": {"type": "string"}}
        assert spec.parameters["required"] == ["input"]
    assert (note.grammar, note.strict) == (None, False)
    assert patch.grammar == InputGrammar("lark", APPLY_PATCH_LARK, "tools[1].format.definition")
    assert patch.strict and patch.description == APPLY_PATCH["description"]
    assert names.custom == {"note", "apply_patch"}
    assert _mapped(tools=[{"type": "custom", "name": "bare"}])[0].tools[0].grammar is None


def test_tool_choice_custom_forces_that_tool() -> None:
    gen, _ = _mapped(tools=[NOTE, APPLY_PATCH], tool_choice={"type": "custom", "name": "note"})
    assert (gen.tool_choice.mode, gen.tool_choice.name) == ("tool", "note")


def test_an_unknown_custom_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        ResponsesRequest.model_validate(
            {"input": "x", "tools": [{"type": "custom", "name": "t", "format": {"type": "x"}}]}
        )


@pytest.mark.parametrize("step", [1, 2, 3, 5, 11])
def test_a_string_argument_decodes_as_its_json_streams(step: int) -> None:
    value = 'a"b\\c\n\té \U0001f600 end'
    for text in (json.dumps({"input": value}), json.dumps({"input": value}, ensure_ascii=False)):
        reader = StringArgumentStream("input")
        pieces = [reader.feed(text[i : i + step]) for i in range(0, len(text), step)]
        assert "".join(pieces) == value
    assert StringArgumentStream("input").feed('{"cmd": "x", "input": "y"}') == ""


def _stream(*events: Any) -> tuple[ResponseStream, list[Any]]:
    _, names = _mapped(tools=[APPLY_PATCH])
    stream = ResponseStream(new_response("resp_x", "m"), names)
    out: list[Any] = []
    for event in (Admitted("r", 10, 0, 100), *events, Done("tool_use", Usage(10, 0, 9))):
        out += stream.feed(event)
    return stream, out


def test_a_streamed_custom_call_sends_its_raw_text_in_deltas() -> None:
    arguments = json.dumps({"input": PATCH})
    cut = arguments.index("\\\\") + 1  # a piece ends inside an escape
    stream, events = _stream(
        ToolCallStart("toolu_9", "apply_patch"),
        ToolInputDelta("toolu_9", arguments[:cut]),
        ToolInputDelta("toolu_9", arguments[cut:]),
        ToolCallEvent("toolu_9", "apply_patch", arguments),
    )
    kinds = [e.type for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert "".join(e.delta for e in deltas) == PATCH
    [call] = stream.response.output
    assert call.type == "custom_tool_call" and call.id.startswith("ctc_")
    assert (call.call_id, call.name, call.input, call.status) == (
        "call_9",
        "apply_patch",
        PATCH,
        "completed",
    )
    assert {e.item_id for e in deltas} == {call.id} and {e.output_index for e in deltas} == {0}
    assert events[-3].input == PATCH


def test_a_custom_call_that_arrives_whole_is_one_delta() -> None:
    stream, events = _stream(ToolCallEvent("toolu_1", "apply_patch", json.dumps({"input": "x"})))
    assert [e.delta for e in events if e.type.endswith("input.delta")] == ["x"]
    assert stream.response.output[0].input == "x"


# --- served -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    settings = {"threads_dir": tmp_path_factory.mktemp("custom") / "threads"}
    with serve(tiny_model_dir, sdk="openai", settings=settings) as server:
        yield server


def _scripted_call(name: str, text: str) -> str:
    call = json.dumps({"name": name, "arguments": {"input": text}}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


@slow
def test_a_custom_call_comes_back_as_a_custom_tool_call_item(served: Served) -> None:
    served.scripted.enqueue(_scripted_call("note", 'remember: "x" \\ y\nz'))
    response = served.client.responses.create(
        model="local", input="note it", tools=[NOTE], store=False
    )
    [call] = response.output
    assert call.type == "custom_tool_call" and call.name == "note"
    assert call.input == 'remember: "x" \\ y\nz' and call.call_id.startswith("call_")

    served.scripted.enqueue("Noted.")
    history: list[Any] = [
        {"role": "user", "content": "note it"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "note", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "ok"},
    ]
    answer = served.client.responses.create(model="local", input=history, tools=[NOTE], store=False)
    assert answer.output_text == "Noted."


@slow
def test_a_streamed_custom_call_through_the_sdk(served: Served) -> None:
    served.scripted.enqueue(_scripted_call("apply_patch", PATCH))
    with served.client.responses.stream(
        model="local",
        input="add a.py",
        tools=[APPLY_PATCH],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"},
        store=False,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    added = kinds.index("response.output_item.added")
    done = kinds.index("response.custom_tool_call_input.done")
    assert kinds[added + 1 : done] == ["response.custom_tool_call_input.delta"] * (done - added - 1)
    assert kinds[done + 1 :] == ["response.output_item.done", "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    [call] = final.output
    assert call.type == "custom_tool_call" and deltas == call.input == PATCH


@slow
def test_a_stored_custom_call_continues_by_id(served: Served) -> None:
    served.scripted.enqueue(_scripted_call("note", "abc"))
    first = served.client.responses.create(model="local", input="note", tools=[NOTE])
    [call] = first.output
    assert call.type == "custom_tool_call"
    served.scripted.enqueue("Done.")
    second = served.client.responses.create(
        model="local",
        previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "ok"}],
        tools=[NOTE],
    )
    assert second.output_text == "Done."


@slow
def test_a_broken_grammar_is_a_400_naming_the_field(served: Served) -> None:
    broken = {**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": "start: nope"}}
    url = served.server.url + "/v1/responses"
    for choice in ("auto", {"type": "custom", "name": "apply_patch"}):
        body = {"model": "m", "input": "hi", "tools": [NOTE, broken], "tool_choice": choice}
        response = httpx.post(url, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("tools[1].format.definition: ")
        assert "'nope' is used but never defined" in error["message"]
    too_big = {**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": "x" * (2 << 20)}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.format\.definition"):
        served.client.responses.create(
            model="m",
            input="hi",
            tools=[too_big],  # type: ignore[list-item]
            store=False,
        )
    unknown = {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "ebnf"}}
    response = httpx.post(url, json={"model": "m", "input": "hi", "tools": [unknown]})
    assert response.status_code == 400 and "tools" in response.json()["error"]["message"]


# Two families with different call markup: a JSON envelope (the patch JSON-escaped inside
# the arguments object) and parameter elements (the patch raw between tags).
SAMPLED_TEMPLATES = ["qwen3-0.6b", "qwen3-coder"]


@pytest.fixture(scope="module", params=SAMPLED_TEMPLATES)
def unscripted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A random-weight model of the template's family, its output not scripted."""
    template = FIXTURES / "chat-templates" / f"{request.param}.jinja"
    path = build_model(
        tmp_path_factory.mktemp(request.param), "tiny", template=real_template_family(template)
    )
    settings = {"threads_dir": tmp_path_factory.mktemp("threads")}
    with serve(path, sdk="openai", settings=settings, scripted=False) as server:
        yield server


@slow
def test_a_forced_custom_call_of_a_random_model_is_a_patch(unscripted: Served) -> None:
    bounded = {**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": BOUNDED_LARK}}
    for seed in range(3):
        with unscripted.client.responses.stream(
            model="local",
            input="Edit a file.",
            tools=[bounded],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "apply_patch"},
            temperature=1.0,
            max_output_tokens=400,
            store=False,
            extra_body={"seed": seed},
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()
        assert final.status == "completed", final
        assert final.output  # one call or more: parallel calls are on
        for index, call in enumerate(final.output):
            assert call.type == "custom_tool_call" and call.name == "apply_patch"
            assert patch_hunks(call.input), call.input
            deltas = [
                e.delta
                for e in events
                if e.type == "response.custom_tool_call_input.delta" and e.output_index == index
            ]
            assert "".join(deltas) == call.input


# --- Chat Completions ---------------------------------------------------------------------

CHAT_PATCH_TOOL: dict[str, Any] = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": BOUNDED_LARK}},
    },
}


def _chat(**body: Any) -> Any:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    )
    return chat_request(request, request_id="c", context_window=4096)


def test_chat_custom_tools_are_offered_and_forced() -> None:
    gen = _chat(
        tools=[CHAT_PATCH_TOOL], tool_choice={"type": "custom", "custom": {"name": "apply_patch"}}
    )
    [spec] = gen.tools
    assert spec.grammar == InputGrammar(
        "lark", BOUNDED_LARK, "tools[0].custom.format.grammar.definition"
    )
    assert spec.parameters["properties"] == {"input": {"type": "string"}}
    assert (gen.tool_choice.mode, gen.tool_choice.name) == ("tool", "apply_patch")


def test_chat_custom_calls_in_the_history_are_their_input() -> None:
    call = {"id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    gen = _chat(
        tools=[CHAT_PATCH_TOOL],
        messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
    )
    [record] = gen.messages[1].tool_calls
    assert (record.name, record.arguments) == ("apply_patch", {"input": PATCH})
    with pytest.raises(ValueError, match="custom"):
        ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]}],
            }
        )


def test_chat_custom_calls_stream_their_raw_input() -> None:
    arguments = json.dumps({"input": PATCH})
    stream = ChatChunkStream(completion_id="c", model="m", created=0, custom={"apply_patch"})
    chunks: list[Any] = []
    for event in (
        Admitted("r", 10, 0, 100),
        ToolCallStart("toolu_3", "apply_patch"),
        ToolInputDelta("toolu_3", arguments[:20]),
        ToolInputDelta("toolu_3", arguments[20:]),
        ToolCallEvent("toolu_3", "apply_patch", arguments),
        Done("tool_use", Usage(10, 0, 9)),
    ):
        chunks += stream.feed(event)
    pieces = [
        c.choices[0].delta.tool_calls[0]
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    ]
    assert pieces[0].type == "custom" and pieces[0].custom.name == "apply_patch"
    assert "".join(p.custom.input or "" for p in pieces) == PATCH
    [call] = stream.completion().choices[0].message.tool_calls or []
    assert call.model_dump() == {
        "id": "call_3",
        "type": "custom",
        "custom": {"name": "apply_patch", "input": PATCH},
    }


@slow
def test_a_chat_custom_call_of_a_random_model_is_a_patch(unscripted: Served) -> None:
    completion = unscripted.client.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "Edit a file."}],
        tools=[CHAT_PATCH_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "custom", "custom": {"name": "apply_patch"}},
        parallel_tool_calls=False,
        temperature=1.0,
        max_tokens=400,
    )
    [call] = completion.choices[0].message.tool_calls or []
    assert call.type == "custom" and call.custom.name == "apply_patch"
    assert patch_hunks(call.custom.input), call.custom.input
