"""Anthropic → chat-template mapping: tool pairing, errors, title requests, system turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlxlaunch.engine.prompt.system_turns import (
    INSTRUCTION_OPEN,
    SystemTurns,
    fold_system_turns,
    marked_instruction,
)
from mlxlaunch.engine.types import ChatMessage, InvalidRequest
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.server.mapping import (
    TITLE_MAX_CHARS,
    TITLE_MAX_TOKENS,
    bounded_strings,
    to_generation_request,
)


def _map(messages: list[dict[str, Any]], **fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 50, "messages": messages, **fields}
    return to_generation_request(MessagesRequest.model_validate(body))


def _calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": i, "name": f"T{i}", "input": {"n": i}} for i in ids],
    }


def _results(*ids: str, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": i, "content": f"result {i}"} for i in ids
    ]
    if text is not None:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def test_results_are_reordered_to_the_order_of_the_calls() -> None:
    gen = _map([{"role": "user", "content": "go"}, _calls("a", "b", "c"), _results("c", "a", "b")])
    tools = gen.messages[2:]
    assert [(m.role, m.tool_call_id, m.name, m.content) for m in tools] == [
        ("tool", "a", "Ta", "result a"),
        ("tool", "b", "Tb", "result b"),
        ("tool", "c", "Tc", "result c"),
    ]


def test_text_after_results_follows_them() -> None:
    gen = _map([{"role": "user", "content": "go"}, _calls("a"), _results("a", text="next")])
    assert [m.role for m in gen.messages] == ["user", "assistant", "tool", "user"]
    assert gen.messages[3].content == "next"


def test_results_may_span_turns_until_the_next_assistant_turn() -> None:
    gen = _map(
        [
            {"role": "user", "content": "go"},
            _calls("a", "b"),
            _results("b"),
            {"role": "system", "content": "note"},
            _results("a"),
        ]
    )
    assert [(m.role, m.tool_call_id) for m in gen.messages[2:]] == [
        ("tool", "b"),
        ("system", None),
        ("tool", "a"),
    ]


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "user", "content": "go"}, _calls("a"), _results("zzz")], "zzz"),
        ([_results("a")], "tool_use_id 'a'"),
        ([{"role": "user", "content": "go"}, _calls("a"), _results("a", "a")], "more than once"),
        (
            [
                {"role": "user", "content": "go"},
                _calls("a", "b"),
                _results("a"),
                {"role": "assistant", "content": "hm"},
            ],
            "without tool_result",
        ),
    ],
    ids=["unknown-id", "no-call-at-all", "duplicate", "missing-result"],
)
def test_inconsistent_tool_history_is_invalid(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        _map(messages)


def test_a_trailing_call_without_result_is_fine() -> None:
    gen = _map([{"role": "user", "content": "go"}, _calls("a")])
    assert gen.messages[-1].tool_calls[0].id == "a"


def test_error_results_are_marked_and_block_content_joined() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "a",
        "is_error": True,
        "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
    }
    gen = _map(
        [{"role": "user", "content": "go"}, _calls("a"), {"role": "user", "content": [result]}]
    )
    tool = gen.messages[2]
    assert tool.is_error and tool.content == "[tool error]\nline 1\n\nline 2"


def test_thinking_history_and_signatures_are_accepted_as_they_are() -> None:
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "step one", "signature": "anything-at-all"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "answer"},
        ],
    }
    gen = _map([{"role": "user", "content": "q"}, assistant, {"role": "user", "content": "more"}])
    assert gen.messages[1].reasoning == "step one" and gen.messages[1].content == "answer"


def test_images_in_tool_results_become_placeholders() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    result = {"type": "tool_result", "tool_use_id": "a", "content": [image]}
    gen = _map(
        [{"role": "user", "content": "go"}, _calls("a"), {"role": "user", "content": [result]}]
    )
    assert gen.messages[2].content == "[image omitted]"


def test_title_requests_are_short_bounded_and_without_thinking(fixtures_dir: Path) -> None:
    body = json.loads((fixtures_dir / "title-request.json").read_text())["body"]
    body["thinking"] = {"type": "enabled", "budget_tokens": 2000}
    gen = to_generation_request(MessagesRequest.model_validate(body))
    assert gen.kind == "title" and gen.thinking is False and gen.thinking_budget is None
    assert gen.max_tokens == TITLE_MAX_TOKENS < 32000
    assert gen.response_schema is not None
    assert gen.response_schema["properties"]["title"] == {
        "type": "string",
        "maxLength": TITLE_MAX_CHARS,
    }
    # The client's schema itself is left alone.
    assert "maxLength" not in body["output_config"]["format"]["schema"]["properties"]["title"]


def test_bounded_strings_keeps_bounded_and_non_string_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 5},
            "b": {"type": "string", "enum": ["x"]},
            "c": {"type": "integer"},
            "d": {"type": "string"},
        },
    }
    out = bounded_strings(schema, 9)["properties"]
    assert out["a"]["maxLength"] == 5 and "maxLength" not in out["b"]
    assert out["c"] == {"type": "integer"} and out["d"]["maxLength"] == 9


# --- mid-conversation system turns -----------------------------------------------------------


def test_fold_into_the_user_turn_before() -> None:
    messages = [
        ChatMessage("system", "top"),
        ChatMessage("user", "hello"),
        ChatMessage("system", "be brief"),
        ChatMessage("assistant", "ok"),
    ]
    folded = fold_system_turns(messages)
    assert [(m.role, m.content) for m in folded] == [
        ("system", "top"),
        ("user", "hello\n\n" + marked_instruction("be brief")),
        ("assistant", "ok"),
    ]
    assert messages[1].content == "hello"  # the input is not modified


def test_fold_after_tool_results_goes_to_the_next_user_turn_or_its_own() -> None:
    messages = [
        ChatMessage("user", "go"),
        ChatMessage("assistant", "", tool_calls=[]),
        ChatMessage("tool", "out", tool_call_id="a"),
        ChatMessage("system", "note"),
        ChatMessage("user", "next"),
        ChatMessage("assistant", "x"),
        ChatMessage("tool", "out2", tool_call_id="b"),
        ChatMessage("system", "last"),
    ]
    folded = fold_system_turns(messages)
    assert [m.role for m in folded] == [
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert folded[3].content == marked_instruction("note") + "\n\nnext"
    assert folded[6].content == marked_instruction("last")


class _Template:
    """A tokenizer double: only its chat template matters here."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls = 0

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        self.calls += 1
        if self.behaviour == "raises" and any(m["role"] == "system" for m in messages[1:]):
            raise ValueError("Conversation roles must alternate user/assistant")
        kept = (
            messages
            if self.behaviour == "renders"
            else messages[:1] + [m for m in messages[1:] if m["role"] != "system"]
        )
        return "|".join(f"{m['role']}:{m['content']}" for m in kept)


@pytest.mark.parametrize(
    ("behaviour", "folds"), [("renders", False), ("raises", True), ("drops", True)]
)
def test_system_turns_fold_only_where_the_template_needs_it(behaviour: str, folds: bool) -> None:
    template = _Template(behaviour)
    turns = SystemTurns(template)
    messages = [
        ChatMessage("system", "top"),
        ChatMessage("user", "u"),
        ChatMessage("system", "mid"),
    ]
    placed = turns.place(messages)
    assert (placed != messages) is folds
    assert placed[0] == ChatMessage("system", "top")  # never folded into the top-level prompt
    if folds:
        assert INSTRUCTION_OPEN in placed[1].content
    turns.place(messages)
    assert template.calls == 1  # probed once
