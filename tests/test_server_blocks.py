"""The content-block state machine, without a server: the stream it emits is re-parsed and
checked against the grammar, and must say what the non-streaming message says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from stream_grammar import check_stream

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    EngineEvent,
    Progress,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
    Usage,
)
from mlxlaunch.protocol.sse import encode_event, parse_frames
from mlxlaunch.server.blocks import ContentBlockStream, anthropic_stop_reason
from mlxlaunch.server.search_backends import SearchResult
from mlxlaunch.server.web_search import SearchOutcome, ServedEvent, decode_page


def _run(events: list[EngineEvent], *, show_thinking: bool = True) -> tuple[bytes, dict[str, Any]]:
    """Feed `events`; return the SSE bytes and the non-streaming message (as JSON)."""
    blocks = ContentBlockStream(
        message_id="msg_test", model="any-model", show_thinking=show_thinking
    )
    sse = b"".join(encode_event(e) for event in events for e in blocks.feed(event))
    assert blocks.finished
    return sse, blocks.message.model_dump(mode="json")


def _sdk_message(sse: bytes) -> dict[str, Any]:
    """What the official SDK's stream accumulator builds from the bytes."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for sse_frame in parse_frames(sse.decode()):
        event: RawMessageStreamEvent = sse_frame.json()  # type: ignore[assignment]
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return snapshot.to_dict(mode="json")  # type: ignore[no-any-return]


def _done(reason: StopReason = "end_turn", output: int = 7, seq: str | None = None) -> Done:
    return Done(stop_reason=reason, usage=Usage(100, 60, output), stop_sequence=seq)


MIXED: list[EngineEvent] = [
    Admitted("r", prompt_tokens=100, cached_tokens=60, max_tokens=50),
    Progress(20, 40),
    ThinkingDelta("let me "),
    ThinkingDelta("think"),
    TextDelta("Hello"),
    TextDelta(""),
    TextDelta(", world"),
    ToolCallEvent(id="toolu_a", name="Bash", arguments='{"command": "ls -la", "n": [1, 2]}'),
    ToolCallEvent(id="toolu_b", name="Read", arguments='{"path": "ü.txt"}'),
    _done("tool_use"),
]


def test_stream_and_message_say_the_same() -> None:
    sse, message = _run(MIXED)
    summary = check_stream(parse_frames(sse.decode()))
    assert summary.blocks == message["content"]
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert message["content"][0]["thinking"] == "let me think"
    assert message["content"][0]["signature"]
    assert message["content"][1]["text"] == "Hello, world"
    assert message["content"][2]["input"] == {"command": "ls -la", "n": [1, 2]}
    assert message["content"][3] == {
        "type": "tool_use",
        "id": "toolu_b",
        "name": "Read",
        "input": {"path": "ü.txt"},
    }
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 40,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 60,
    }
    sdk = _sdk_message(sse)
    assert sdk["content"] == message["content"]
    assert sdk["usage"]["input_tokens"] == 40 and sdk["usage"]["cache_read_input_tokens"] == 60
    assert sdk["stop_reason"] == "tool_use" and sdk["model"] == "any-model"


def test_message_start_carries_prompt_usage() -> None:
    sse, _ = _run(MIXED)
    first = parse_frames(sse.decode())[0].json()
    assert first["type"] == "message_start"
    assert first["message"]["content"] == []
    assert first["message"]["usage"]["input_tokens"] == 40
    assert first["message"]["usage"]["cache_read_input_tokens"] == 60


def test_omitted_thinking_sends_only_block_and_signature() -> None:
    sse, message = _run(MIXED, show_thinking=False)
    assert b"thinking_delta" not in sse
    assert b"let me" not in sse
    assert message["content"][0]["thinking"] == ""
    assert message["content"][0]["signature"]
    deltas = [
        f.json()["delta"]["type"]
        for f in parse_frames(sse.decode())
        if f.event == "content_block_delta"
    ]
    assert deltas.count("signature_delta") == 1


def test_thinking_after_text_is_a_new_block() -> None:
    events: list[EngineEvent] = [
        TextDelta("a"),
        ThinkingDelta("b"),
        TextDelta("c"),
        _done(),
    ]
    sse, message = _run(events)
    summary = check_stream(parse_frames(sse.decode()))
    assert [b["type"] for b in summary.blocks] == ["text", "thinking", "text"]
    assert summary.blocks == message["content"]


def test_empty_reply() -> None:
    sse, message = _run([Admitted("r", 5, 0, 5), _done(output=0)])
    summary = check_stream(parse_frames(sse.decode()))
    assert summary.blocks == [] == message["content"]
    assert summary.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("engine", "wire"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("tool_use", "tool_use"),
        ("context_window", "model_context_window_exceeded"),
    ],
)
def test_stop_reasons(engine: StopReason, wire: str) -> None:
    assert anthropic_stop_reason(engine) == wire
    seq = "END" if engine == "stop_sequence" else None
    _, message = _run([TextDelta("x"), _done(engine, seq=seq)])
    assert message["stop_reason"] == wire
    assert message["stop_sequence"] == seq


def test_bad_tool_arguments_never_reach_the_client_as_bad_json() -> None:
    sse, message = _run([ToolCallEvent(id="", name="T", arguments="{not json"), _done("tool_use")])
    check_stream(parse_frames(sse.decode()))
    block = message["content"][0]
    assert block["input"] == {} and block["id"].startswith("toolu_")


def test_input_json_pieces_concatenate_to_the_arguments() -> None:
    args = {"command": "echo 'hi' > \"f\"", "nested": {"a": [1, None, True]}}
    sse, _ = _run(
        [ToolCallEvent(id="t", name="Bash", arguments=json.dumps(args)), _done("tool_use")]
    )
    pieces = [
        f.json()["delta"]["partial_json"]
        for f in parse_frames(sse.decode())
        if f.event == "content_block_delta"
    ]
    assert json.loads("".join(pieces)) == args


def test_event_after_done_is_a_bug() -> None:
    blocks = ContentBlockStream(message_id="m", model="x")
    blocks.feed(_done())
    with pytest.raises(RuntimeError):
        blocks.feed(TextDelta("late"))


STREAMED_ARGS = '{"file_path": "/tmp/a.py", "content": "print(1)\\n"}'


def _streamed_call(call_id: str, name: str, arguments: str, cut: int) -> list[EngineEvent]:
    """A call whose arguments arrive in pieces of `cut` characters while they are written."""
    pieces = [arguments[i : i + cut] for i in range(0, len(arguments), cut)]
    return [
        ToolCallStart(call_id, name),
        *(ToolInputDelta(call_id, p) for p in pieces),
        ToolCallEvent(call_id, name, arguments),
    ]


def test_streamed_tool_input_reaches_the_client_in_pieces() -> None:
    events: list[EngineEvent] = [
        TextDelta("Writing."),
        *_streamed_call("toolu_w", "Write", STREAMED_ARGS, 5),
        *_streamed_call("toolu_r", "Read", '{"file_path": "/tmp/a.py"}', 3),
        _done("tool_use"),
    ]
    sse, message = _run(events)
    frames = list(parse_frames(sse.decode()))
    check_stream(frames)
    deltas = [
        f.json()["delta"]["partial_json"]
        for f in frames
        if f.event == "content_block_delta" and f.json()["index"] == 1
    ]
    assert len(deltas) == -(-len(STREAMED_ARGS) // 5)  # one per piece, none held back
    assert "".join(deltas) == STREAMED_ARGS
    assert message["content"][1] == {
        "type": "tool_use",
        "id": "toolu_w",
        "name": "Write",
        "input": json.loads(STREAMED_ARGS),
    }
    assert message["content"][2]["input"] == {"file_path": "/tmp/a.py"}
    assert _sdk_message(sse)["content"] == message["content"]


def test_a_started_call_without_pieces_sends_its_arguments_whole() -> None:
    events: list[EngineEvent] = [
        ToolCallStart("toolu_x", "Bash"),
        ToolCallEvent("toolu_x", "Bash", '{"command": "ls"}'),
        _done("tool_use"),
    ]
    sse, message = _run(events)
    check_stream(parse_frames(sse.decode()))
    assert message["content"] == [
        {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {"command": "ls"}}
    ]
    assert _sdk_message(sse)["content"] == message["content"]


def test_streamed_tool_input_opens_the_block_before_the_arguments_end() -> None:
    blocks = ContentBlockStream(message_id="m", model="x")
    blocks.feed(Admitted("r", prompt_tokens=10, cached_tokens=0, max_tokens=50))
    opened = blocks.feed(ToolCallStart("toolu_s", "Edit"))
    assert [type(e).__name__ for e in opened] == ["ContentBlockStartEvent"]
    piece = blocks.feed(ToolInputDelta("toolu_s", '{"old'))
    assert [type(e).__name__ for e in piece] == ["ContentBlockDeltaEvent"]


@pytest.mark.parametrize("with_client_call", [False, True], ids=["server-only", "mixed"])
def test_a_server_tool_call_and_its_outcome_are_blocks(with_client_call: bool) -> None:
    """A call of the request's web search tool is a `server_tool_use` block under the id the
    server tool loop gave it, its outcome a `web_search_tool_result` block with the results
    (page text opaque, readable back by us), the same streamed (as the SDK accumulates it)
    and whole; the turn ends for the client only if it also has a client call to run."""
    hit = SearchResult("https://ml-explore.github.io/mlx", "MLX", "An array framework", "2 days")
    events: list[ServedEvent] = [
        ToolCallStart(id="srvtoolu_1", name="web_search"),
        ToolInputDelta(id="srvtoolu_1", partial_json='{"query": "mlx"}'),
        ToolCallEvent(id="srvtoolu_1", name="web_search", arguments='{"query": "mlx"}'),
        SearchOutcome("srvtoolu_1", "web_search", "mlx", results=(hit,)),
        TextDelta("MLX is an array framework [1]."),
    ]
    if with_client_call:
        events.append(ToolCallEvent(id="c2", name="Read", arguments='{"file_path": "a"}'))
    events.append(_done("tool_use"))
    blocks = ContentBlockStream(
        message_id="msg_test", model="m", server_tools=frozenset({"web_search"})
    )
    sse = b"".join(encode_event(e) for event in events for e in blocks.feed(event))
    check_stream(parse_frames(sse.decode()))
    message = blocks.message.model_dump(mode="json")
    assert _sdk_message(sse)["content"] == message["content"]
    call, result, text, *rest = message["content"]
    assert call == {
        "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
        "input": {"query": "mlx"},
    }  # fmt: skip
    assert result["type"] == "web_search_tool_result" and result["tool_use_id"] == "srvtoolu_1"
    (entry,) = result["content"]
    assert entry["type"] == "web_search_result" and entry["url"] == hit.url
    assert entry["title"] == "MLX" and entry["page_age"] == "2 days"
    assert decode_page(entry["encrypted_content"]) == "An array framework"
    assert text["text"] == "MLX is an array framework [1]."
    assert [block["type"] for block in rest] == (["tool_use"] if with_client_call else [])
    assert message["stop_reason"] == ("tool_use" if with_client_call else "end_turn")
    assert message["usage"]["server_tool_use"] == {
        "web_search_requests": 1, "web_fetch_requests": 0
    }  # fmt: skip


def test_a_failed_search_is_the_error_result_and_is_not_counted() -> None:
    blocks = ContentBlockStream(message_id="m", model="x", server_tools=frozenset({"web_search"}))
    for event in (
        ToolCallEvent(id="srvtoolu_2", name="web_search", arguments='{"query": "q"}'),
        SearchOutcome("srvtoolu_2", "web_search", "q", error="too_many_requests"),
        _done("end_turn"),
    ):
        blocks.feed(event)
    message = blocks.message.model_dump(mode="json")
    assert message["content"][1]["content"] == {
        "type": "web_search_tool_result_error", "error_code": "too_many_requests"
    }  # fmt: skip
    assert message["usage"]["server_tool_use"]["web_search_requests"] == 0


def test_usage_has_no_server_tool_counter_without_server_tools() -> None:
    blocks = ContentBlockStream(message_id="m", model="x")
    blocks.feed(TextDelta("hi"))
    blocks.feed(_done("end_turn"))
    assert "server_tool_use" not in blocks.message.model_dump(mode="json")["usage"]
