"""Context management served for real: the official SDK's beta client against a live server
on the tiny model. Edits reach the model (placeholders in the prompt the engine renders), the
answer carries `applied_edits` streaming and not, count_tokens carries the original count,
invalid edits are 400s naming the field, and a 40-turn tool session measures what clearing
costs in re-prefilled tokens, read from the engine's own prefix cache (`cache_read_input_tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from engine_helpers import Served, scripted_server

from mlxlaunch.server import context_edits
from mlxlaunch.server.context_edits import CLEARED_TOOL_RESULT

pytestmark = pytest.mark.slow  # every test here serves a model

BETA = "context-management-2025-06-27"
TOKEN = "ctx-token"
SOURCES = Path(__file__).resolve().parent.parent / "mlxlaunch"
CALL = '<tool_call>\n{"name": "Read", "arguments": {"path": "%s"}}\n</tool_call>'


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    with scripted_server(tiny_model_dir, TOKEN) as server:
        yield server


def _source_texts() -> list[str]:
    """Real tool output: pieces of this project's own source, ~2.4 kB each."""
    text = "".join(path.read_text() for path in sorted(SOURCES.rglob("*.py"))[:80])
    return [text[i : i + 2400] for i in range(0, len(text) - 2400, 2400)]


def _session(turns: int, *, thinking: bool = False) -> list[dict[str, Any]]:
    """A user request, then `turns` Read calls, each answered by a tool result."""
    texts = _source_texts()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for n in range(turns):
        call: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{n:03}", "name": "Read", "input": {"path": f"f{n}"}}
        ]
        if thinking:
            call.insert(0, {"type": "thinking", "thinking": f"Next, file {n}.", "signature": "x"})
        messages.append({"role": "assistant", "content": call})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n:03}", "content": texts[n]}
        messages.append({"role": "user", "content": [result]})
    return messages


TOOLS: list[Any] = [
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def _clear_tools(**fields: Any) -> dict[str, Any]:
    return {"edits": [{"type": "clear_tool_uses_20250919", **fields}]}


def _create(
    served: Served, messages: list[dict[str, Any]], edits: dict[str, Any], **more: Any
) -> Any:
    """One non-streaming beta request with `edits`, answered with a single token."""
    create: Any = served.anthropic.beta.messages.create  # untyped: tests send loose dicts
    return create(
        model="m",
        max_tokens=1,
        tools=TOOLS,
        messages=messages,
        betas=[BETA],
        context_management=edits,
        **more,
    )


def _tool_contents(served: Served) -> list[str]:
    """What the model was shown as tool results, in the last request it served."""
    return [m.content for m in served.scripted.requests[-1].messages if m.role == "tool"]


def test_cleared_results_reach_the_model_as_placeholders(served: Served) -> None:
    edits = _clear_tools(
        trigger={"type": "tool_uses", "value": 4}, keep={"type": "tool_uses", "value": 2}
    )
    reply = _create(served, _session(10), edits)
    assert reply.context_management is not None
    (applied,) = reply.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919"
    # 8 clearable uses of ~600 tokens: the first 7 make a whole step of 4096, the 8th waits
    # for the next one.
    assert applied.cleared_tool_uses == 7
    contents = _tool_contents(served)
    assert contents[:7] == [CLEARED_TOOL_RESULT] * 7
    assert CLEARED_TOOL_RESULT not in contents[7:]
    # The figure is the engine's exact count: the prompt shrank by exactly that much.
    plain = served.anthropic.messages.count_tokens(
        model="m",
        tools=TOOLS,
        messages=_session(10),  # type: ignore[arg-type]
    )
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == (
        plain.input_tokens - applied.cleared_input_tokens
    )


def test_the_stream_carries_the_edits_on_message_delta(served: Served) -> None:
    events: list[Any] = []
    with served.anthropic.beta.messages.stream(
        model="m",
        max_tokens=1,
        tools=TOOLS,
        messages=_session(9),  # type: ignore[arg-type]
        betas=[BETA],
        context_management=_clear_tools(  # type: ignore[arg-type]
            trigger={"type": "tool_uses", "value": 1},
            keep={"type": "tool_uses", "value": 1},
            clear_tool_inputs=True,
        ),
    ) as stream:
        events.extend(stream)
        final = stream.get_final_message()
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.context_management is not None
    assert delta.context_management.applied_edits[0].cleared_tool_uses == 7
    start = next(e for e in events if e.type == "message_start")
    assert start.message.context_management is None
    assert final.context_management == delta.context_management
    calls = [m for m in served.scripted.requests[-1].messages if m.role == "assistant"]
    arguments = [c.tool_calls[0].arguments for c in calls]
    assert arguments == [{}] * 7 + [{"path": "f7"}, {"path": "f8"}]


def test_below_the_trigger_nothing_is_cleared_and_the_answer_says_so(
    served: Served,
) -> None:
    reply = _create(served, _session(3), _clear_tools())  # the default trigger: 100k tokens
    assert reply.context_management is not None
    assert reply.context_management.applied_edits == []
    assert CLEARED_TOOL_RESULT not in _tool_contents(served)


def test_clear_at_least_is_a_floor(served: Served) -> None:
    # Two clearable uses of ~600 tokens: never 100k at once.
    edits = _clear_tools(
        trigger={"type": "tool_uses", "value": 1},
        keep={"type": "tool_uses", "value": 1},
        clear_at_least={"type": "input_tokens", "value": 100_000},
    )
    reply = _create(served, _session(3), edits)
    assert reply.context_management is not None
    assert reply.context_management.applied_edits == []


def test_thinking_of_older_turns_is_cleared(served: Served) -> None:
    keep = {"type": "thinking_turns", "value": 1}
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    reply = _create(served, _session(4, thinking=True), edits, thinking=thinking)
    assert reply.context_management is not None
    (applied,) = reply.context_management.applied_edits
    assert applied.type == "clear_thinking_20251015"
    assert applied.cleared_thinking_turns == 3
    assert applied.cleared_input_tokens > 0
    turns = [m for m in served.scripted.requests[-1].messages if m.role == "assistant"]
    assert [t.reasoning for t in turns] == [None, None, None, "Next, file 3."]


def test_claude_codes_own_edit_clears_nothing(served: Served, fixtures_dir: Path) -> None:
    body = json.loads((fixtures_dir / "tool-result-request.json").read_text())["body"]
    body.update(stream=False, max_tokens=1)
    response = served.post("/v1/messages", body)
    assert response.status_code == 200, response.text
    assert response.json()["context_management"] == {"applied_edits": []}
    # Without the field, the answer has none.
    del body["context_management"]
    assert "context_management" not in served.post("/v1/messages", body).json()


def test_count_tokens_gives_the_original_count_beside_the_edited_one(
    served: Served,
) -> None:
    client = served.anthropic
    edits = _clear_tools(
        trigger={"type": "input_tokens", "value": 1000}, keep={"type": "tool_uses", "value": 1}
    )
    counted = client.beta.messages.count_tokens(
        model="m",
        tools=TOOLS,
        messages=_session(10),  # type: ignore[arg-type]
        betas=[BETA],
        context_management=edits,  # type: ignore[arg-type]
    )
    plain = client.messages.count_tokens(model="m", tools=TOOLS, messages=_session(10))  # type: ignore[arg-type]
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == plain.input_tokens
    assert counted.input_tokens < plain.input_tokens - 2000
    assert (
        "context_management"
        not in served.post(
            "/v1/messages/count_tokens", {"model": "m", "messages": _session(1)}
        ).json()
    )


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": "2"}},
            "keep.value",
        ),
        ({"type": "clear_tool_uses_20250920"}, "unknown type 'clear_tool_uses_20250920'"),
        ({"type": "compact_20260112"}, "compact_20260112"),
    ],
)
def test_invalid_edits_are_400s_naming_the_field(
    served: Served, edit: dict[str, Any], named: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        _create(served, [{"role": "user", "content": "hi"}], {"edits": [edit]})
    assert info.value.status_code == 400
    body: Any = info.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert "context_management.edits.0" in body["error"]["message"]
    assert named in body["error"]["message"]


# --- what an edit costs the prefix cache -------------------------------------------------------


def _run_session(served: Served, name: str, turns: int, edits: dict[str, Any] | None) -> list[Any]:
    """A tool loop of `turns` turns: the model calls Read, the client answers with a file's
    text and resends everything, as Claude Code does. The usage of each turn, in order.
    `name` opens the conversation, so no run reads another's cached prompts."""
    texts = _source_texts()
    create: Any = served.anthropic.beta.messages.create
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{name}: read the files."}]
    usages: list[Any] = []
    extra: dict[str, Any] = {"context_management": edits, "betas": [BETA]} if edits else {}
    for n in range(turns):
        served.scripted.enqueue(CALL % f"f{n}")
        reply = create(model="m", max_tokens=64, tools=TOOLS, messages=messages, **extra)
        usages.append(reply.usage)
        (call,) = [b for b in reply.content if b.type == "tool_use"]
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        result = {"type": "tool_result", "tool_use_id": call.id, "content": texts[n]}
        messages.append({"role": "user", "content": [result]})
    return usages


def test_stepped_clearing_keeps_the_cached_prefix_across_turns(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figure of issue 32: re-prefill caused by clear_tool_uses in a 40-turn session.

    Three runs of the same session (each result ~600 tokens; the edit fires past 8k tokens and
    keeps 3 uses): no edit (every turn only prefills what is new), Anthropic's own rule
    (everything beyond `keep` cleared on every turn: a boundary that moves each turn), and
    ours (whole steps: 4096 tokens, the default, with 2k and 8k beside it). What a run
    prefills beyond the no-edit run is what its clearing cost; it prints per run (`pytest -s`).
    """
    turns = 40
    edits = _clear_tools(
        trigger={"type": "input_tokens", "value": 8000}, keep={"type": "tool_uses", "value": 3}
    )
    runs: dict[str, list[Any]] = {"no edit": _run_session(served, "no edit", turns, None)}
    for step in (0, 2048, 4096, 8192):
        name = f"steps of {step}" if step else "moving (Anthropic)"
        monkeypatch.setattr(context_edits, "DEFAULT_STEP_TOKENS", step)
        runs[name] = _run_session(served, name, turns, edits)
    monkeypatch.undo()

    baseline = sum(u.input_tokens for u in runs["no edit"])
    print(f"\n{turns}-turn tool session, ~600-token results, trigger 8k, keep 3:")
    print(f"{'run':<20}{'prefilled':>10}{'re-prefill':>11}{'breaks':>7}{'last prompt':>12}")
    figures: dict[str, int] = {}
    for name, usages in runs.items():
        prefilled = sum(u.input_tokens for u in usages)
        # A turn whose prefill is well over what it adds: its cached prefix was cut short.
        breaks = sum(u.input_tokens > 1500 for u in usages[1:])
        last = usages[-1].input_tokens + usages[-1].cache_read_input_tokens
        figures[name] = prefilled - baseline
        print(f"{name:<20}{prefilled:>10}{prefilled - baseline:>11}{breaks:>7}{last:>12}")
    # Token counts, not times: the steps cost less re-prefill than a boundary moving each turn.
    assert figures["steps of 4096"] < figures["moving (Anthropic)"]
    # Both kept the prompt small; the un-edited one kept growing.
    no_edit_last = runs["no edit"][-1]
    assert runs["steps of 4096"][-1].cache_read_input_tokens < no_edit_last.cache_read_input_tokens
