"""Context edits as pure functions: what the wire types accept and refuse (400s naming the
field), which tool uses and thinking turns each edit clears, and the step cut that keeps a
cleared prompt's prefix the same from one turn to the next."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from mlxlaunch.engine.types import Done, TextDelta
from mlxlaunch.engine.types import Usage as EngineUsage
from mlxlaunch.protocol.context_management import (
    ClearedThinking,
    ClearThinkingEdit,
    ClearToolUsesEdit,
    ContextManagementResponse,
    ToolUsesTrigger,
)
from mlxlaunch.protocol.errors import describe_validation_error
from mlxlaunch.protocol.events import MessageDeltaBody, MessageDeltaEvent, MessageStartEvent
from mlxlaunch.protocol.requests import (
    InputMessage,
    MessagesRequest,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from mlxlaunch.protocol.responses import Message, Usage
from mlxlaunch.server import context_edits
from mlxlaunch.server.blocks import ContentBlockStream
from mlxlaunch.server.context_edits import CLEARED_TOOL_RESULT, ToolUse


def _body(edits: Any, **more: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": edits},
        **more,
    }


def _refusal(edits: Any) -> str:
    body = _body(edits)
    with pytest.raises(ValidationError) as info:
        MessagesRequest.model_validate(body)
    return describe_validation_error(info.value, body)


# --- the wire types -----------------------------------------------------------------------


def test_defaults_are_anthropics() -> None:
    body = MessagesRequest.model_validate(
        _body([{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}])
    )
    assert body.context_management is not None
    thinking, tools = body.context_management.edits
    assert isinstance(thinking, ClearThinkingEdit) and thinking.kept_turns == 1
    assert isinstance(tools, ClearToolUsesEdit)
    assert (tools.trigger.type, tools.trigger.value) == ("input_tokens", 100_000)
    assert tools.keep.value == 3
    assert tools.clear_at_least is None and not tools.exclude_tools
    assert not tools.clears_input_of("Bash")


def test_claude_codes_edit_and_every_keep_spelling_validate() -> None:
    for keep, kept in (
        ("all", None),
        ({"type": "all"}, None),
        ({"type": "thinking_turns", "value": 2}, 2),
    ):
        body = MessagesRequest.model_validate(
            _body([{"type": "clear_thinking_20251015", "keep": keep}])
        )
        assert body.context_management is not None
        edit = body.context_management.edits[0]
        assert isinstance(edit, ClearThinkingEdit) and edit.kept_turns == kept


def test_a_full_tool_edit_validates() -> None:
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 5},
        "keep": {"type": "tool_uses", "value": 0},
        "clear_at_least": {"type": "input_tokens", "value": 500},
        "exclude_tools": ["web_search"],
        "clear_tool_inputs": ["Write"],
    }
    parsed = MessagesRequest.model_validate(_body([edit])).context_management
    assert parsed is not None
    tools = parsed.edits[0]
    assert isinstance(tools, ClearToolUsesEdit) and isinstance(tools.trigger, ToolUsesTrigger)
    assert tools.clears_input_of("Write") and not tools.clears_input_of("Read")
    assert tools.excludes("web_search")


@pytest.mark.parametrize(
    ("edits", "names"),
    [
        (
            [{"type": "clear_everything_20990101"}],
            "context_management.edits.0: unknown type 'clear_everything_20990101'",
        ),
        ([{"keep": "all"}], "context_management.edits.0.type: Field required"),
        (
            [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 0}}],
            "context_management.edits.0.trigger.value",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "trigger": {"type": "messages", "value": 3}}],
            "context_management.edits.0.trigger: unknown type 'messages'",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}],
            "context_management.edits.0.keep.value",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": "3"}}],
            "context_management.edits.0.keep.value",
        ),
        (
            [
                {
                    "type": "clear_tool_uses_20250919",
                    "clear_at_least": {"type": "tool_uses", "value": 3},
                }
            ],
            "context_management.edits.0.clear_at_least.type",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "exclude_tools": "Bash"}],
            "context_management.edits.0.exclude_tools",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"}],
            "context_management.edits.0.clear_tool_inputs",
        ),
        ([{"type": "clear_thinking_20251015", "keep": "some"}], "context_management.edits.0.keep"),
        (
            [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns"}}],
            "context_management.edits.0.keep",
        ),
        (
            [{"type": "clear_thinking_20251015"}, {"type": "clear_thinking_20251015"}],
            "edits.1: clear_thinking_20251015 appears more than once",
        ),
        ([{"type": "compact_20260112"}], "context_management.edits.0: compact_20260112"),
        ({"type": "clear_thinking_20251015"}, "context_management.edits"),
    ],
)
def test_invalid_edits_are_refused_naming_the_field(edits: Any, names: str) -> None:
    assert names in _refusal(edits)


def test_the_answer_rides_on_message_delta_and_the_message() -> None:
    answer = ContextManagementResponse.model_validate(
        {
            "applied_edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "cleared_tool_uses": 2,
                    "cleared_input_tokens": 90,
                }
            ]
        }
    )
    event = MessageDeltaEvent(delta=MessageDeltaBody(), usage=Usage(), context_management=answer)
    assert event.model_dump()["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 2
    # Left out when the request asked for nothing.
    assert (
        "context_management"
        not in MessageDeltaEvent(delta=MessageDeltaBody(), usage=Usage()).model_dump()
    )
    assert "context_management" not in Message(id="msg_1", model="m").model_dump()


@pytest.mark.parametrize("timings", [False, True])
def test_the_block_stream_puts_the_answer_on_message_delta_only(timings: bool) -> None:
    answer = ContextManagementResponse(
        applied_edits=[ClearedThinking(cleared_thinking_turns=3, cleared_input_tokens=40)]
    )
    blocks = ContentBlockStream(
        message_id="msg_1", model="m", timings=timings, context_management=answer
    )
    events = [
        *blocks.feed(TextDelta("hi")),
        *blocks.feed(Done(stop_reason="end_turn", usage=EngineUsage(10, 0, 1))),
    ]
    start = next(e for e in events if isinstance(e, MessageStartEvent))
    delta = next(e for e in events if isinstance(e, MessageDeltaEvent))
    assert start.message.context_management is None
    assert delta.context_management == answer
    assert blocks.message.context_management == answer  # the non-streaming body
    assert blocks.message.model_dump()["context_management"]["applied_edits"][0] == {
        "type": "clear_thinking_20251015",
        "cleared_thinking_turns": 3,
        "cleared_input_tokens": 40,
    }


# --- which uses are cleared -----------------------------------------------------------------


def _conversation(results: list[tuple[str, str]], thinking: bool = False) -> list[InputMessage]:
    """A user turn, then one assistant call and its result per (tool, result text)."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n, (tool, text) in enumerate(results):
        call: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{n}", "name": tool, "input": {"n": n}}
        ]
        if thinking:
            call.insert(0, {"type": "thinking", "thinking": f"think {n}", "signature": "s"})
        turns.append({"role": "assistant", "content": call})
        turns.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}],
            }
        )
    return [InputMessage.model_validate(t) for t in turns]


def _edit(**fields: Any) -> ClearToolUsesEdit:
    return ClearToolUsesEdit.model_validate({"type": "clear_tool_uses_20250919", **fields})


def _results(messages: list[InputMessage]) -> list[str]:
    return [
        block.content[0].text  # type: ignore[union-attr]
        for message in messages
        for block in message.content
        if isinstance(block, ToolResultBlock)
    ]


def test_the_oldest_uses_beyond_keep_are_cleared_excluded_tools_never() -> None:
    messages = _conversation(
        [("Read", "a" * 400), ("Grep", "b" * 400), ("Read", "c" * 400), ("Read", "d" * 400)]
    )
    edit = _edit(keep={"type": "tool_uses", "value": 1}, exclude_tools=["Grep"])
    uses = context_edits.tool_uses(messages, edit)
    assert [u.name for u in uses] == ["Read", "Grep", "Read", "Read"]
    assert uses[0].size == 100  # 400 bytes at 4 a token
    candidates = context_edits.clearable(uses, edit)
    assert [u.call[0] for u in candidates] == [1, 5]  # Grep excluded; the last Read kept
    cleared = context_edits.clear_tool_uses(messages, edit, candidates)
    assert _results(cleared) == [CLEARED_TOOL_RESULT, "b" * 400, CLEARED_TOOL_RESULT, "d" * 400]
    # Inputs stay unless asked; the client's own messages are untouched.
    inputs = [b.input for m in cleared for b in m.content if isinstance(b, ToolUseBlock)]
    assert inputs == [{"n": n} for n in range(4)]
    assert _results(messages) == ["a" * 400, "b" * 400, "c" * 400, "d" * 400]


def test_clear_tool_inputs_empties_the_named_tools_calls_only() -> None:
    messages = _conversation([("Write", "ok"), ("Read", "text")])
    edit = _edit(keep={"type": "tool_uses", "value": 0}, clear_tool_inputs=["Write"])
    uses = context_edits.tool_uses(messages, edit)
    cleared = context_edits.clear_tool_uses(messages, edit, uses)
    inputs = [b.input for m in cleared for b in m.content if isinstance(b, ToolUseBlock)]
    assert inputs == [{}, {"n": 1}]
    assert _results(cleared) == [CLEARED_TOOL_RESULT, CLEARED_TOOL_RESULT]


def test_an_error_result_stays_an_error() -> None:
    messages = _conversation([("Bash", "boom")])
    raw = messages[2].content[0]
    assert isinstance(raw, ToolResultBlock)
    messages[2] = messages[2].model_copy(
        update={"content": [raw.model_copy(update={"is_error": True})]}
    )
    edit = _edit(keep={"type": "tool_uses", "value": 0})
    cleared = context_edits.clear_tool_uses(messages, edit, context_edits.tool_uses(messages, edit))
    block = cleared[2].content[0]
    assert isinstance(block, ToolResultBlock) and block.is_error


def test_triggers_count_tokens_or_tool_uses() -> None:
    messages = _conversation([("Read", "x")] * 3)
    by_tokens = _edit(trigger={"type": "input_tokens", "value": 1000})
    uses = context_edits.tool_uses(messages, by_tokens)
    assert not context_edits.triggered(by_tokens, uses, 1000)
    assert context_edits.triggered(by_tokens, uses, 1001)
    by_uses = _edit(trigger={"type": "tool_uses", "value": 2})
    assert context_edits.triggered(by_uses, uses, 0)
    assert not context_edits.triggered(
        _edit(trigger={"type": "tool_uses", "value": 3}), uses, 10**6
    )


# --- steps ----------------------------------------------------------------------------------


def _uses(sizes: list[int]) -> list[ToolUse]:
    return [ToolUse((n, 0), (n + 1, 0), "t", size) for n, size in enumerate(sizes)]


def test_only_whole_steps_are_cleared() -> None:
    assert context_edits.whole_steps(_uses([300, 300, 300, 300, 300]), 1000) == 4
    assert context_edits.whole_steps(_uses([300, 300, 300]), 1000) == 0
    assert context_edits.whole_steps(_uses([5000, 10]), 1000) == 1
    # Step 0 clears every candidate: Anthropic's own behaviour.
    assert context_edits.whole_steps(_uses([1, 2, 3]), 0) == 3


@given(
    st.lists(st.integers(0, 3000), max_size=40),
    st.lists(st.integers(0, 3000), max_size=20),
    st.integers(0, 8000),
)
def test_steps_never_move_as_the_conversation_grows(
    sizes: list[int], more: list[int], step: int
) -> None:
    """What a turn clears, every later turn clears too, and clearing grows by whole steps: the
    prompt up to the first use cleared later is the same on every turn in between."""
    before = context_edits.whole_steps(_uses(sizes), step)
    after = context_edits.whole_steps(_uses(sizes + more), step)
    assert after >= before
    assert context_edits.whole_steps(_uses(sizes[:before]), step) == before


# --- thinking -------------------------------------------------------------------------------


def _thinking_left(messages: list[InputMessage]) -> list[bool]:
    return [
        any(isinstance(b, ThinkingBlock) for b in m.content)
        for m in messages
        if m.role == "assistant"
    ]


def test_thinking_is_kept_for_the_last_turns_only() -> None:
    messages = _conversation([("Read", "x")] * 4, thinking=True)
    edit = ClearThinkingEdit.model_validate(
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    )
    cleared, turns = context_edits.clear_thinking(messages, edit)
    assert turns == 3
    assert _thinking_left(cleared) == [False, False, False, True]
    # The calls themselves stay.
    assert sum(isinstance(b, ToolUseBlock) for m in cleared for b in m.content) == 4


def test_keep_all_changes_nothing() -> None:
    messages = _conversation([("Read", "x")] * 4, thinking=True)
    edit = ClearThinkingEdit.model_validate({"type": "clear_thinking_20251015", "keep": "all"})
    cleared, turns = context_edits.clear_thinking(messages, edit)
    assert turns == 0 and cleared == messages
