"""The benchmark's conversations: the session grows as specified, and every wire shape carries
the same system text, tools and messages."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.prompt import claude_code_prompt
from mlxlaunch.bench.wire import anthropic_body, openai_body, openai_messages
from mlxlaunch.bench.workloads import agent_session, first_turn, tool_result_text

PROMPT = claude_code_prompt()


def test_shipped_prompt_matches_the_captured_request(fixtures_dir: Path) -> None:
    captured = json.loads((fixtures_dir / "tool-result-request.json").read_text())["body"]
    blocks = [b["text"] for b in captured["system"] if "billing-header" not in b["text"]]
    assert PROMPT.system == "\n\n".join(blocks)
    assert [t.name for t in PROMPT.tools] == [t["name"] for t in captured["tools"]]
    assert "x-anthropic-billing-header" not in PROMPT.system
    assert "Primary working directory" in PROMPT.first_user  # environment turn folded in


def test_quick_prompt_is_a_short_version_of_the_same() -> None:
    quick = claude_code_prompt(quick=True)
    assert PROMPT.system.startswith(quick.system)
    assert len(quick.system) < len(PROMPT.system) / 3
    assert {t.name for t in quick.tools} < {t.name for t in PROMPT.tools}


@pytest.mark.parametrize("turns", [1, 2, 5])
def test_agent_session_grows_by_one_tool_round_trip_per_turn(turns: int) -> None:
    session = agent_session(PROMPT, turns=turns, tool_result_chars=2500)
    assert len(session) == turns
    for number, conversation in enumerate(session, start=1):
        assert conversation.system == PROMPT.system
        assert conversation.tools == PROMPT.tools
        assert len(conversation.messages) == 1 + 2 * (number - 1)
    for before, after in itertools.pairwise(session):
        assert after.messages[: len(before.messages)] == before.messages  # resends everything
        call, result = after.messages[len(before.messages) :]
        assert call.role == "assistant" and len(call.tool_calls) == 1
        assert call.tool_calls[0].name in {t.name for t in PROMPT.tools}
        assert result.role == "tool" and result.tool_call_id == call.tool_calls[0].id
        assert len(result.content) == 2500


def test_sessions_differ_only_after_the_shared_prefix() -> None:
    a, b = first_turn(PROMPT, "a"), first_turn(PROMPT, "b")
    assert (a.system, a.tools) == (b.system, b.tools)
    assert a.messages[0].content != b.messages[0].content
    assert a.messages[0].content.startswith(PROMPT.first_user)


def test_tool_results_are_deterministic_and_sized() -> None:
    assert tool_result_text(3, 4000) == tool_result_text(3, 4000)
    assert tool_result_text(3, 4000) != tool_result_text(4, 4000)
    assert len(tool_result_text(7, 123)) == 123


def test_anthropic_translation_carries_every_message_and_tool() -> None:
    conversation = agent_session(PROMPT, turns=3, tool_result_chars=100)[-1]
    body = anthropic_body(conversation, max_tokens=7)
    assert body["stream"] is True and body["max_tokens"] == 7
    assert body["system"] == PROMPT.system
    assert [t["name"] for t in body["tools"]] == [t.name for t in PROMPT.tools]
    assert body["tools"][0]["input_schema"] == PROMPT.tools[0].parameters
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    tool_use = body["messages"][1]["content"][0]
    result = body["messages"][2]["content"][0]
    assert tool_use["type"] == "tool_use" and result["type"] == "tool_result"
    assert result["tool_use_id"] == tool_use["id"]
    assert result["content"] == conversation.messages[2].content
    assert tool_use["input"] == conversation.messages[1].tool_calls[0].arguments


def test_openai_translation_carries_the_same_conversation() -> None:
    conversation = agent_session(PROMPT, turns=3, tool_result_chars=100)[-1]
    body = openai_body(conversation, max_tokens=7)
    anthropic = anthropic_body(conversation, max_tokens=7)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == anthropic["temperature"]
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": PROMPT.system}
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "tool", "assistant", "tool"]
    for tool, tool_a in zip(body["tools"], anthropic["tools"], strict=True):
        assert tool["type"] == "function"
        assert tool["function"]["name"] == tool_a["name"]
        assert tool["function"]["description"] == tool_a["description"]
        assert tool["function"]["parameters"] == tool_a["input_schema"]
    call = messages[2]["tool_calls"][0]
    tool_use = anthropic["messages"][1]["content"][0]
    assert call["id"] == tool_use["id"] and call["function"]["name"] == tool_use["name"]
    assert json.loads(call["function"]["arguments"]) == tool_use["input"]
    assert messages[3]["tool_call_id"] == call["id"]
    assert messages[3]["content"] == anthropic["messages"][2]["content"][0]["content"]
    assert messages[1]["content"] == anthropic["messages"][0]["content"]


def test_chat_template_shape_keeps_arguments_as_objects() -> None:
    conversation = agent_session(PROMPT, turns=2, tool_result_chars=10)[-1]
    call = openai_messages(conversation, arguments_as_json=False)[2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], dict)


def test_plan_orders_floor_prompts_like_the_servers_see_them() -> None:
    config = BenchConfig.create(quick=True, turns=4)
    plan = build_plan(config)
    labels = [label for label, _ in plan.floor_prompts()]
    assert labels == ["cold", "turn 1", "turn 2", "turn 3", "turn 4", "warm 1", "restart"]
    assert len(plan.turns) == 4 and len(plan.warm) == config.warm_sessions
    assert "restart" not in [label for label, _ in build_plan(replace(config, restart=False))
                             .floor_prompts()]  # fmt: skip


def test_concurrent_streams_have_prompts_of_their_own_of_the_asked_size() -> None:
    config = BenchConfig.create(concurrency=(1, 4), concurrency_prompt_tokens=300)
    assert (
        BenchConfig().concurrency_tokens == 48 and BenchConfig().concurrency_prompt_tokens == 2000
    )
    plan = build_plan(config, chars_per_token=3.0)
    assert sorted(plan.streams) == [1, 4] and len(plan.streams[4]) == 4
    users = [c.messages[-1].content for level in plan.streams.values() for c in level]
    assert len(set(users)) == 5  # nothing shared beyond the short system prompt
    assert all(900 <= len(u) <= 1000 for u in users)  # 300 tokens × 3 characters, plus a line
    assert build_plan(config, chars_per_token=3.0).streams == plan.streams  # deterministic


def test_config_overrides_and_validation() -> None:
    assert BenchConfig.create(quick=True, turns=None).turns == BenchConfig.quick_defaults().turns
    assert BenchConfig.create(turns=9).turns == 9
    with pytest.raises(ValueError):
        BenchConfig(concurrency=())
