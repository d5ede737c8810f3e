"""Wire types: what the request models accept and refuse, error envelopes, SSE framing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from stream_grammar import StreamGrammarError, check_stream

from mlxlaunch.protocol import ERROR_STATUS, error_body, frame, parse_frames
from mlxlaunch.protocol.errors import describe_validation_error
from mlxlaunch.protocol.requests import (
    CountTokensRequest,
    MessagesRequest,
    ThinkingAdaptive,
    ToolResultBlock,
    ToolUseBlock,
)
from mlxlaunch.protocol.sse import FrameReader, SseFrame, aiter_frames, iter_frames

FIXTURE_FILES = ("print-mode-request.json", "title-request.json", "tool-result-request.json")


def _body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(overrides)
    return body


def _refusal(body: Any) -> str:
    with pytest.raises(ValidationError) as info:
        MessagesRequest.model_validate(body)
    return describe_validation_error(info.value, body)


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_claude_code_requests_validate(fixtures_dir: Path, name: str) -> None:
    body = json.loads((fixtures_dir / name).read_text())["body"]
    req = MessagesRequest.model_validate(body)
    assert req.stream is True
    assert req.max_tokens == 32000
    assert len(req.messages) == len(body["messages"])


def test_fixture_details_survive(fixtures_dir: Path) -> None:
    body = json.loads((fixtures_dir / "tool-result-request.json").read_text())["body"]
    req = MessagesRequest.model_validate(body)
    assert [m.role for m in req.messages] == ["user", "system", "assistant", "user"]
    tool_use = req.messages[2].content[0]
    tool_result = req.messages[3].content[0]
    assert isinstance(tool_use, ToolUseBlock) and tool_use.name == "Bash"
    assert isinstance(tool_result, ToolResultBlock) and tool_result.tool_use_id == "toolu_01"
    assert tool_result.content[0].type == "text"
    assert isinstance(req.thinking, ThinkingAdaptive) and req.thinking.display == "omitted"
    title = json.loads((fixtures_dir / "title-request.json").read_text())["body"]
    fmt = MessagesRequest.model_validate(title).response_format
    assert fmt is not None and "title" in fmt.json_schema["properties"]


def test_unknown_fields_are_ignored_everywhere() -> None:
    body = _body(
        service_tier="auto",
        safeguards={"x": 1},
        context_management={"edits": []},
        output_config={"effort": "max", "brand_new": True},
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a", "cache_control": {"type": "x"}}],
                "new_message_field": 1,
            }
        ],
        tools=[
            {
                "type": "custom",
                "name": "T",
                "input_schema": {"type": "object"},
                "defer_loading": True,
                "eager_input_streaming": True,
                "input_examples": [{}],
                "strict": True,
            }
        ],
        thinking={"type": "enabled", "budget_tokens": 1024, "display": "summarized", "z": 1},
    )
    req = MessagesRequest.model_validate(body)
    assert req.tools and req.tools[0].strict and req.tools[0].is_client_tool


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"model": ""}, "model"),
        ({"model": 7}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": 3}, "temperature"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tools": [{"name": "T"}]}, "tools.0"),
        ({"system": 5}, "system"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ],
)
def test_strict_fields_name_the_path(overrides: dict[str, Any], path: str) -> None:
    message = _refusal(_body(**overrides))
    assert message.startswith(f"{path}:"), message


def test_missing_max_tokens() -> None:
    body = _body()
    del body["max_tokens"]
    assert _refusal(body) == "max_tokens: Field required"


def test_malformed_block_names_the_nested_field() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "tool_result", "content": "x"}]
    message = _refusal(_body(messages=[{"role": "user", "content": content}]))
    assert message == "messages.0.content.1.tool_use_id: Field required"


def test_unknown_block_type_is_named() -> None:
    content = [{"type": "hologram", "data": "x"}]
    message = _refusal(_body(messages=[{"role": "user", "content": content}]))
    assert message.startswith("messages.0.content.0: unknown type 'hologram'")


def test_block_without_type() -> None:
    message = _refusal(_body(messages=[{"role": "user", "content": [{"text": "x"}]}]))
    assert message == "messages.0.content.0.type: Field required"


def test_system_turn_must_be_text() -> None:
    turn = {"role": "system", "content": [{"type": "image", "source": {"type": "base64"}}]}
    message = _refusal(_body(messages=[{"role": "user", "content": "a"}, turn]))
    assert message.startswith("messages.1:") and "only text" in message


def test_string_content_and_system_are_text_blocks() -> None:
    req = MessagesRequest.model_validate(_body(system="be brief"))
    assert req.system is not None and req.system[0].text == "be brief"
    assert req.messages[0].content[0].type == "text"


def test_count_tokens_needs_no_max_tokens() -> None:
    req = CountTokensRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert req.model == "m"


def test_every_captured_request_validates_for_both_endpoints(fixtures_dir: Path) -> None:
    # Globbed, not listed: a newly captured Claude Code request is checked against every rule.
    bodies = [json.loads(p.read_text()).get("body") for p in sorted(fixtures_dir.glob("*.json"))]
    requests = [b for b in bodies if isinstance(b, dict)]
    assert len(requests) >= 3
    for body in requests:
        MessagesRequest.model_validate(body)
        CountTokensRequest.model_validate(body)


# --- emptiness: Anthropic's rules ---------------------------------------------------------

USER_A = {"role": "user", "content": "a"}
EMPTY_TURN = (
    "all messages must have non-empty content except for the optional final assistant message"
)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"stop_sequences": ["END", ""]},
            "stop_sequences.1: each stop sequence must contain non-whitespace",
        ),
        (
            {"stop_sequences": [" \n\t"]},
            "stop_sequences.0: each stop sequence must contain non-whitespace",
        ),
        ({"messages": [{"role": "user", "content": ""}]}, f"messages.0.content: {EMPTY_TURN}"),
        ({"messages": [{"role": "user", "content": []}]}, f"messages.0.content: {EMPTY_TURN}"),
        (
            {"messages": [USER_A, {"role": "system", "content": ""}, USER_A]},
            f"messages.1.content: {EMPTY_TURN}",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "messages.0.content.0.text: text content blocks must be non-empty",
        ),
        (
            {
                "messages": [
                    USER_A,
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}],
                    },
                ]
            },
            "messages.1.content.1.text: text content blocks must be non-empty",
        ),
    ],
    ids=[
        "empty-stop",
        "blank-stop",
        "empty-string-user",
        "no-blocks-user",
        "empty-system-turn",
        "empty-text-block",
        "empty-second-text-block",
    ],
)
def test_empty_content_is_refused_like_anthropic(overrides: dict[str, Any], expected: str) -> None:
    assert _refusal(_body(**overrides)) == expected


def test_empty_turn_is_refused_by_count_tokens_too() -> None:
    body = {"model": "m", "messages": [USER_A, {"role": "user", "content": []}]}
    with pytest.raises(ValidationError) as info:
        CountTokensRequest.model_validate(body)
    assert describe_validation_error(info.value, body) == f"messages.1.content: {EMPTY_TURN}"


@pytest.mark.parametrize(
    "overrides",
    [
        {"messages": [USER_A, {"role": "assistant", "content": ""}]},
        {"messages": [USER_A, {"role": "assistant", "content": []}]},
        # Assistant turns may be empty anywhere: a local model's empty reply comes back in the
        # history of every later request, and a 400 there would wedge the session.
        {"messages": [USER_A, {"role": "assistant", "content": []}, USER_A]},
        {"messages": [USER_A, {"role": "assistant", "content": ""}, USER_A]},
        {
            "messages": [
                USER_A,
                {"role": "assistant", "content": [{"type": "text", "text": ""}]},
                USER_A,
            ]
        },
        # PROTOCOL.md says nothing against a leading assistant turn: it stays accepted.
        {"messages": [{"role": "assistant", "content": "x"}, USER_A]},
        {"stop_sequences": ["\n\nHuman:", " END "]},
        # Only text directly in a message is held to it; tool results and system stay lenient.
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": ""},
                        {
                            "type": "tool_result",
                            "tool_use_id": "u",
                            "content": [{"type": "text", "text": ""}],
                        },
                    ],
                }
            ]
        },
        {"system": [{"type": "text", "text": ""}]},
    ],
    ids=[
        "empty-string-prefill",
        "no-blocks-prefill",
        "no-blocks-assistant-mid",
        "empty-string-assistant-mid",
        "empty-text-block-assistant-mid",
        "leading-assistant",
        "stop-with-text",
        "empty-tool-results",
        "empty-system-block",
    ],
)
def test_allowed_emptiness_is_accepted(overrides: dict[str, Any]) -> None:
    MessagesRequest.model_validate(_body(**overrides))


def test_type_errors_inside_a_text_block_name_the_field_once() -> None:
    # The block's tag and its field are both called `text`: the path must show it once.
    content = [{"type": "text", "text": 5}]
    message = _refusal(_body(messages=[{"role": "user", "content": content}]))
    assert message == "messages.0.content.0.text: Input should be a valid string"
    thinking = [{"type": "thinking", "thinking": 5}]
    message = _refusal(_body(messages=[USER_A, {"role": "assistant", "content": thinking}]))
    assert message == "messages.1.content.0.thinking: Input should be a valid string"
    assert _refusal(_body(system=[{"type": "text", "text": 5}])).startswith("system.0.text: ")


def test_error_envelope_and_table() -> None:
    assert error_body("rate_limit_error", "slow down") == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    assert ERROR_STATUS["invalid_request_error"] == 400
    assert ERROR_STATUS["authentication_error"] == 401
    assert ERROR_STATUS["overloaded_error"] == 529
    assert ERROR_STATUS["api_error"] == 500


def test_sse_frame_round_trip() -> None:
    raw = frame("ping", {"type": "ping"}) + frame("x", {"type": "x", "s": "a\nb ü"})
    assert raw.startswith(b'event: ping\ndata: {"type":"ping"}\n\n')
    frames = parse_frames(raw.decode())
    assert [f.event for f in frames] == ["ping", "x"]
    assert frames[1].json()["s"] == "a\nb ü"


async def test_sse_frames_parse_line_by_line_as_a_stream_arrives() -> None:
    lines = [
        ": comment",
        "event: stats",
        "data: {",
        "data: }",
        "",
        "event: ping\r",
        "",
        "data: cut",
    ]
    seen: list[SseFrame] = []
    reader = FrameReader()
    for line in lines[:5]:
        if (done := reader.line(line)) is not None:
            seen.append(done)
    assert seen == [SseFrame("stats", "{\n}")]  # whole as soon as its blank line arrives
    expected = [SseFrame("stats", "{\n}"), SseFrame("ping", ""), SseFrame(None, "cut")]
    assert list(iter_frames(lines)) == expected  # an unterminated last frame still counts

    async def arriving() -> AsyncIterator[str]:
        for line in lines:
            yield line

    assert [f async for f in aiter_frames(arriving())] == expected
    assert parse_frames("\r\n".join(lines)) == expected


def _stream(*events: dict[str, Any]) -> list[Any]:
    return parse_frames(b"".join(frame(e["type"], e) for e in events).decode())


START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 0},
    },
}
DELTA = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn"},
    "usage": {"output_tokens": 2},
}
STOP = {"type": "message_stop"}


def _block(index: int, text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
        {"type": "content_block_stop", "index": index},
    ]


def test_grammar_checker_accepts_a_good_stream() -> None:
    summary = check_stream(
        _stream(START, {"type": "ping"}, *_block(0, "a"), *_block(1, "b"), DELTA, STOP)
    )
    assert [b["text"] for b in summary.blocks] == ["a", "b"]
    assert summary.stop_reason == "end_turn" and summary.pings == 1


@pytest.mark.parametrize(
    "events",
    [
        [*_block(0, "a"), DELTA, STOP],  # no message_start
        [START, *_block(1, "a"), DELTA, STOP],  # index does not start at 0
        [START, *_block(0, "a"), *_block(0, "b"), DELTA, STOP],  # repeated index
        [START, *_block(0, "a")[:2], *_block(1, "b"), DELTA, STOP],  # two blocks open
        [START, *_block(0, "a"), STOP],  # no message_delta
        [START, *_block(0, "a"), DELTA],  # no message_stop: dropped connection
        [START, *_block(0, "a"), DELTA, STOP, {"type": "ping"}],  # after the end
    ],
)
def test_grammar_checker_rejects_bad_streams(events: list[dict[str, Any]]) -> None:
    with pytest.raises(StreamGrammarError):
        check_stream(_stream(*events))
