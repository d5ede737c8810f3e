"""The tool-loop workload: the session it sends (pure), both wire shapes of it, its rows in the
report, and a short run against our server. Checks what is sent and reported, never a time."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jinja2
import pytest

from mlxlaunch.bench.clients import StreamTiming, on_openai_event
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.progress import SilentProgress
from mlxlaunch.bench.prompt import claude_code_prompt
from mlxlaunch.bench.summary import ROW_ORDER, summary_rows, workload_of
from mlxlaunch.bench.tool_loop import (
    TEMPLATE_FAMILY,
    build_tool_loop_model,
    run_tool_loop,
    tool_loop_size,
)
from mlxlaunch.bench.wire import REASONING_FIELD, anthropic_body, openai_body, openai_messages
from mlxlaunch.bench.workloads import LoopTurn, tool_loop_session
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.server.mapping import to_generation_request

TEMPLATE_FILES = (f"{TEMPLATE_FAMILY}.jinja", f"{TEMPLATE_FAMILY}.tokens.json")

OURS, PEER = "mlxlaunch", "mlx_lm.server"
PROMPT = claude_code_prompt(quick=True)
FIXTURES = Path(__file__).parent / "fixtures" / "chat-templates"
PACKAGED = Path(__file__).parent.parent / "mlxlaunch" / "testing" / "templates" / "real"


@pytest.fixture(scope="module")
def session() -> list[LoopTurn]:
    return tool_loop_session(PROMPT, tool_result_chars=300)


def test_session_is_a_prompt_three_rounds_a_new_prompt_two_rounds_a_new_prompt(
    session: list[LoopTurn],
) -> None:
    kinds = [t.kind for t in session]
    rounds = ["tool round"] * 3, ["tool round"] * 2
    assert kinds == ["first prompt", *rounds[0], "new prompt", *rounds[1], "new prompt"]
    assert all(t.conversation.thinking for t in session)
    assert all((t.conversation.system, t.conversation.tools) == (PROMPT.system, PROMPT.tools)
               for t in session)  # fmt: skip
    for before, after in itertools.pairwise(session):
        old = before.conversation.messages
        assistant, last = after.conversation.messages[len(old) :]
        assert after.conversation.messages[: len(old)] == old  # resends everything
        assert assistant.role == "assistant" and assistant.reasoning
        if after.kind == "tool round":
            [call] = assistant.tool_calls
            assert call.name in {t.name for t in PROMPT.tools} and not assistant.content
            assert last.role == "tool" and last.tool_call_id == call.id
            assert len(last.content) == 300
        else:  # the answer that ends a loop, then the user's next prompt
            assert assistant.content and not assistant.tool_calls
            assert last.role == "user" and last.content
    calls = [c.id for t in session for m in t.conversation.messages for c in m.tool_calls]
    assert len(set(calls)) == 5
    assert tool_loop_session(PROMPT, tool_result_chars=300) == session  # deterministic


def test_session_rejects_loops_it_has_no_script_for() -> None:
    with pytest.raises(ValueError):
        tool_loop_session(PROMPT, tool_result_chars=10, rounds=(1, 1, 1))
    for rounds in [(0,), ()]:
        with pytest.raises(ValueError):
            tool_loop_session(PROMPT, tool_result_chars=10, rounds=rounds)


def test_anthropic_body_asks_for_thinking_and_carries_signed_thinking_blocks(
    session: list[LoopTurn],
) -> None:
    body = anthropic_body(session[-1].conversation, max_tokens=4)
    assert body["thinking"] == {"type": "adaptive"}  # shown, so the first thinking delta counts
    assistants = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
    assert [[b["type"] for b in blocks] for blocks in assistants] == (
        [["thinking", "tool_use"]] * 3 + [["thinking", "text"]] + [["thinking", "tool_use"]] * 2
        + [["thinking", "text"]]
    )  # fmt: skip
    assert all(blocks[0]["signature"].startswith("mlxlaunch-") for blocks in assistants)
    assert body["messages"][-1] == {"role": "user", "content": session[-1].conversation
                                    .messages[-1].content}  # fmt: skip


def test_our_server_maps_the_body_back_to_the_same_conversation(
    session: list[LoopTurn],
) -> None:
    for turn in session:
        body = anthropic_body(turn.conversation, max_tokens=4)
        request = to_generation_request(MessagesRequest.model_validate(body))
        assert request.thinking is True
        assert request.messages[0].content == PROMPT.system
        assert request.messages[1:] == turn.conversation.messages


def test_peer_body_carries_reasoning_where_the_template_reads_it(session: list[LoopTurn]) -> None:
    conversation = session[-1].conversation
    body = openai_body(conversation, max_tokens=4)
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    sent = body["messages"][1:]
    assert len(sent) == len(conversation.messages)
    for message, wire in zip(conversation.messages, sent, strict=True):
        assert wire["role"] == message.role and wire["content"] == message.content
        assert wire.get(REASONING_FIELD) == message.reasoning
        for call, wired in zip(message.tool_calls, wire.get("tool_calls", []), strict=True):
            assert wired["id"] == call.id and json.loads(wired["function"]["arguments"]) == (
                call.arguments
            )
    # The other workloads are unchanged: no thinking, none asked for.
    plain = build_plan(BenchConfig.create(quick=True)).turns[-1]
    assert "thinking" not in anthropic_body(plain, max_tokens=4)
    assert openai_body(plain, max_tokens=4)["chat_template_kwargs"] == {"enable_thinking": False}


def _render(conversation: Any) -> str:
    """Qwen3's template over the conversation as mlx_lm.server hands it over."""
    template = (PACKAGED / TEMPLATE_FILES[0]).read_text()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=openai_messages(conversation, arguments_as_json=False),
        tools=[{"type": "function", "function": {"name": t.name}} for t in conversation.tools],
        add_generation_prompt=True,
        enable_thinking=True,
    )


def test_qwen3_template_drops_earlier_thinking_at_a_new_prompt(session: list[LoopTurn]) -> None:
    # What the workload is for: after a new prompt, the template no longer shows the thinking of
    # the loop before it, so a prompt rendered afresh departs from the cached one there.
    loop_thinking = session[3].conversation.messages[1].reasoning
    assert loop_thinking and loop_thinking in _render(session[3].conversation)
    assert loop_thinking not in _render(session[4].conversation)
    this_loop = session[5].conversation.messages[-2].reasoning
    assert this_loop and this_loop in _render(session[5].conversation)


def test_packaged_template_is_the_fixture() -> None:
    for name in TEMPLATE_FILES:
        assert (PACKAGED / name).read_bytes() == (FIXTURES / name).read_bytes()


def test_size_is_the_smallest_in_a_quick_run() -> None:
    assert tool_loop_size("qwen-coder-7b", quick=True) == "tiny"
    assert tool_loop_size("medium", quick=False) == "medium"
    assert tool_loop_size("qwen-coder-7b", quick=False) == "large"


def test_plan_has_the_session_unless_turned_off() -> None:
    assert len(build_plan(BenchConfig.create(quick=True)).tool_loop) == 8
    assert build_plan(BenchConfig.create(quick=True, tool_loop=False)).tool_loop == []


def _timing(ttft: float, prompt: int, cached: int | None) -> dict[str, Any]:
    return {"ttft_s": ttft, "prompt_tokens": prompt, "cached_tokens": cached, "error": None}


def _figures(peer_cached: bool = True) -> dict[str, Any]:
    kinds = ["first prompt", "tool round", "tool round", "new prompt"]
    turns = [
        {
            "turn": n,
            "kind": kind,
            "results": {
                OURS: _timing(0.1 * n, 100 * n, 100 * n - 10),
                PEER: _timing(0.2 * n, 100 * n, 50 * n if peer_cached else None),
            },
        }
        for n, kind in enumerate(kinds, start=1)
    ]
    return {"targets": [OURS, PEER], "turns": turns}


def _loop_rows(loop: dict[str, Any]) -> list[Any]:
    """The report's tool-loop rows, from raw figures of the tool loop alone."""
    servers = {"targets": [], "new_session": {"cold": {}, "warm": []}, "agent_session": [],
               "decode": [], "concurrency": [], "tool_loop": loop}  # fmt: skip
    rows = summary_rows(servers, {})
    order = [ROW_ORDER.index(workload_of(r)) for r in rows]
    assert order == sorted(order)
    return [r for r in rows if r.workload == "tool-loop"]


def test_report_has_a_row_per_kind_of_turn_with_both_servers_and_reuse() -> None:
    rows = _loop_rows(_figures())
    assert [r.metric for r in rows] == ["first prompt TTFT", "tool round TTFT p50",
                                        "new prompt TTFT"]  # fmt: skip
    new = rows[-1]
    assert new.values == {OURS: pytest.approx(0.4), PEER: pytest.approx(0.8)}
    assert new.speedup(OURS, PEER) == pytest.approx(2.0)
    assert new.notes == {OURS: "390/400 cached", PEER: "200/400 cached"}
    assert rows[1].notes[OURS] == "480/500 cached over 2 turns"

    rows = _loop_rows(_figures(peer_cached=False))
    assert rows[-1].notes[PEER] == "400 prompt, reuse not reported"
    assert rows[1].notes[PEER] == "500 prompt over 2 turns, reuse not reported"


def test_peer_usage_without_cached_tokens_is_reported_as_unknown() -> None:
    timing = StreamTiming()
    on_openai_event("", json.dumps({"choices": [], "usage": {"prompt_tokens": 9}}), timing, 0.1)
    assert timing.prompt_tokens == 9 and timing.cached_tokens is None


@pytest.mark.slow
async def test_tool_loop_runs_against_our_server() -> None:
    session = tool_loop_session(PROMPT, tool_result_chars=200)
    figures, warnings = await run_tool_loop(
        session, size="tiny", max_tokens=2, progress=SilentProgress(), peer=False
    )
    assert warnings == [] and figures["targets"] == [OURS]
    assert figures["model"] == {"template": "qwen3-0.6b", "size": "tiny"}
    turns = figures["turns"]
    assert [t["kind"] for t in turns] == [t.kind for t in session]
    for turn in turns:
        timing = turn["results"][OURS]
        assert timing["error"] is None and timing["ttft_s"] is not None
        assert 0 <= timing["cached_tokens"] < timing["prompt_tokens"]
    for before, after in itertools.pairwise(turns):
        if after["kind"] == "tool round":  # a tool round only appends: its prefix is cached
            assert after["results"][OURS]["cached_tokens"] > 0
            assert (
                after["results"][OURS]["prompt_tokens"] > before["results"][OURS]["prompt_tokens"]
            )
    rows = _loop_rows(figures)
    assert len(rows) == 3 and all(r.values[OURS] is not None for r in rows)


@pytest.mark.slow
def test_built_model_speaks_qwen3s_template(tmp_path: Path) -> None:
    from mlx_lm.tokenizer_utils import load

    model_dir = build_tool_loop_model(tmp_path, "tiny")
    tokenizer = load(model_dir)
    assert tokenizer.chat_template == (FIXTURES / TEMPLATE_FILES[0]).read_text()
    assert len(tokenizer.encode("<think>", add_special_tokens=False)) == 1
