"""Anthropic request → engine GenerationRequest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pictures import anthropic_block, png
from starlette.datastructures import Headers

from mlxlaunch.engine.types import (
    ChatMessage,
    ImageInput,
    InvalidRequest,
    ToolCallRecord,
    ToolChoice,
    image_slot,
)
from mlxlaunch.protocol.requests import CountTokensRequest, MessagesRequest
from mlxlaunch.server.agent_headers import MAX_ID_CHARS, AgentHeaders
from mlxlaunch.server.images import ImageAccess
from mlxlaunch.server.mapping import shows_thinking, to_generation_request


def _map(**fields: Any) -> Any:
    body: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(fields)
    return to_generation_request(MessagesRequest.model_validate(body), request_id="msg_x")


def _fixture(fixtures_dir: Path, name: str) -> MessagesRequest:
    return MessagesRequest.model_validate(json.loads((fixtures_dir / name).read_text())["body"])


def test_basic_fields() -> None:
    gen = _map(
        temperature=0.0,
        top_p=0.5,
        top_k=3,
        stop_sequences=["END", "\n\nHuman:"],
        system="sys",
    )
    assert gen.messages == [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", content="hi"),
    ]
    assert (
        gen.max_tokens == 9 and gen.request_id == "msg_x" and gen.model_alias == "claude-haiku-4-5"
    )
    assert (gen.sampling.temperature, gen.sampling.top_p, gen.sampling.top_k) == (0.0, 0.5, 3)
    assert gen.stop_sequences == ["END", "\n\nHuman:"]
    assert gen.thinking is False and gen.tools == [] and gen.response_schema is None


def test_billing_header_is_dropped_and_blocks_joined(fixtures_dir: Path) -> None:
    gen = to_generation_request(_fixture(fixtures_dir, "print-mode-request.json"))
    system = gen.messages[0]
    assert system.role == "system"
    assert "x-anthropic-billing-header" not in system.content
    assert system.content.startswith("You are a Claude agent")
    assert "You are an agent working with the user" in system.content


def test_mid_conversation_system_turn_stays_in_place(fixtures_dir: Path) -> None:
    gen = to_generation_request(_fixture(fixtures_dir, "print-mode-request.json"))
    roles = [m.role for m in gen.messages]
    assert roles == ["system", "user", "system"]
    assert gen.messages[2].content.startswith("# Environment")
    assert "Primary working directory" not in gen.messages[0].content
    assert "Primary working directory" in gen.messages[2].content
    assert gen.messages[1].content.endswith("say hi")


def test_tool_round_trip_history(fixtures_dir: Path) -> None:
    gen = to_generation_request(_fixture(fixtures_dir, "tool-result-request.json"))
    assert [m.role for m in gen.messages] == ["system", "user", "system", "assistant", "tool"]
    call = gen.messages[3].tool_calls[0]
    assert call == ToolCallRecord(
        id="toolu_01",
        name="Bash",
        arguments={
            "command": "echo scripted-ok > proof.txt",
            "description": "Write the proof file",
        },
    )
    result = gen.messages[4]
    assert (result.tool_call_id, result.name, result.content) == (
        "toolu_01",
        "Bash",
        "(Bash completed with no output)",
    )
    assert result.is_error is False
    assert len(gen.tools) == 12 and gen.tools[1].name == "Bash"
    assert gen.tools[1].parameters["type"] == "object"
    assert gen.thinking is True and gen.thinking_budget is None
    assert gen.kind == "main"


def test_tool_results_and_text_keep_their_order() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "A", "input": {"x": 1}},
                {"type": "tool_use", "id": "t2", "name": "B", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "one"}],
                },
                {"type": "tool_result", "tool_use_id": "t2", "content": "two", "is_error": True},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    gen = _map(messages=messages)
    assistant = gen.messages[1]
    assert assistant.content == "calling" and assistant.reasoning == "plan"
    assert [c.name for c in assistant.tool_calls] == ["A", "B"]
    assert [(m.role, m.name, m.content, m.is_error) for m in gen.messages[2:]] == [
        ("tool", "A", "one", False),
        ("tool", "B", "[tool error]\ntwo", True),
        ("user", None, "and now?", False),
    ]


def test_consecutive_system_turns_merge() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "one"},
        {"role": "system", "content": [{"type": "text", "text": "two"}]},
        {"role": "user", "content": "b"},
    ]
    gen = _map(system="top", messages=messages)
    assert [(m.role, m.content) for m in gen.messages] == [
        ("system", "top"),
        ("user", "a"),
        ("system", "one\n\ntwo"),
        ("user", "b"),
    ]


def test_thinking_and_tool_choice() -> None:
    gen = _map(
        thinking={"type": "enabled", "budget_tokens": 2000},
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert gen.thinking is True and gen.thinking_budget == 2000
    assert gen.tool_choice == ToolChoice(mode="any", parallel=False)
    assert _map(thinking={"type": "disabled"}).thinking is False
    assert _map(tool_choice={"type": "tool", "name": "X"}).tool_choice == ToolChoice(
        mode="tool", name="X"
    )
    assert _map(tool_choice={"type": "none"}).tool_choice.mode == "none"
    assert (
        shows_thinking(
            MessagesRequest.model_validate(
                {
                    "model": "m",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "x"}],
                    "thinking": {"type": "adaptive", "display": "omitted"},
                }
            )
        )
        is False
    )


def test_web_search_is_offered_and_other_server_tools_are_not() -> None:
    tools = [
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "code_execution_20250825", "name": "code_execution"},
        {"name": "Read", "description": "read", "input_schema": {"type": "object"}, "strict": True},
    ]
    gen = _map(tools=tools)
    assert [(t.name, t.strict) for t in gen.tools] == [("Read", True), ("web_search", False)]
    assert gen.tools[1].parameters["required"] == ["query"]  # the server answers its calls


def test_title_request(fixtures_dir: Path) -> None:
    gen = to_generation_request(_fixture(fixtures_dir, "title-request.json"))
    assert gen.kind == "title"
    assert gen.response_schema is not None and gen.response_schema["required"] == ["title"]
    assert gen.tools == []


def test_kinds() -> None:
    tool = {"name": "Read", "input_schema": {"type": "object"}}
    sub = "You are an agent for Claude Code, Anthropic's official CLI for Claude. Do the task."
    assert _map(system=sub, tools=[tool]).kind == "subagent"
    assert _map(system="You are a helpful bot", tools=[tool]).kind == "other"
    assert _map().kind == "other"


def test_claude_codes_headers_class_a_request_over_its_system_prompt() -> None:
    """An agent id is a subagent's request even with the main loop's prompt; a Claude Code
    session's request with tools is the main loop's even with a prompt of the user's own; the
    session id keys the conversation in stats. Without tools or for a title, nothing changes."""
    tool = {"name": "Read", "input_schema": {"type": "object"}}
    main = "You are an interactive agent that helps users with software engineering tasks."
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}

    def kind(headers: dict[str, str], **fields: Any) -> tuple[str, str]:
        request = MessagesRequest.model_validate(body | fields)
        gen = to_generation_request(request, agent=AgentHeaders.of(Headers(headers)))
        return gen.kind, gen.cache_key

    session = {"X-Claude-Code-Session-Id": "c22fbc83"}
    subagent = session | {"X-Claude-Code-Agent-Id": "agent-7"}
    assert kind({}, system=main, tools=[tool]) == ("main", "")
    assert kind(subagent, system=main, tools=[tool]) == ("subagent", "c22fbc83")
    assert kind(subagent, system="Review the diff.", tools=[tool]) == ("subagent", "c22fbc83")
    assert kind(session, system="My own agent prompt.", tools=[tool]) == ("main", "c22fbc83")
    assert kind({}, system="My own agent prompt.", tools=[tool]) == ("other", "")
    assert kind(session, system="Summarise this page.") == ("other", "c22fbc83")  # no tools
    web_search = {"type": "web_search_20250305", "name": "web_search"}
    assert kind(session, system="Search.", tools=[web_search])[0] == "other"  # a server tool
    long_id = {"x-claude-code-session-id": "s" * 500}
    assert len(kind(long_id)[1]) == MAX_ID_CHARS


def test_media_is_marked_not_dropped() -> None:
    content = [
        anthropic_block(png(2, 2)),
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "doc body"},
            "title": "T",
        },
        {"type": "text", "text": "what is this?"},
    ]
    messages = [{"role": "user", "content": content}]
    with pytest.raises(InvalidRequest, match="does not accept images"):
        _map(messages=messages)
    body = {"model": "m", "max_tokens": 9, "messages": messages}
    request = MessagesRequest.model_validate(body)
    seen = to_generation_request(request, images=ImageAccess(sees_images=True))
    user = seen.messages[0]
    # A vision model's image stands where it was, as its slot; the bytes go with the request.
    assert user.content.startswith(image_slot(0))
    assert "doc body" in user.content and "what is this?" in user.content
    assert seen.images == [ImageInput("image/png", png(2, 2))]


def test_count_tokens_body_maps_like_a_message_body() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "system": "s",
    }
    counted = to_generation_request(CountTokensRequest.model_validate(body))
    sent = to_generation_request(MessagesRequest.model_validate({**body, "max_tokens": 50}))
    assert counted.messages == sent.messages and counted.tools == sent.tools
