"""Every real chat template in `tests/fixtures/chat-templates/` serves Claude Code.

For each family a tiny test model is built with the family's REAL template and special tokens.
It answers the requests Claude Code really sends (print mode, the turn after a tool result, the
session title), streaming and not, with `count_tokens` equal to the usage. Then the model is
scripted to write a tool call exactly as that family writes it — the text comes from the
fixture itself (`tool_call.assistant_turn_as_rendered`: what the template renders for such a
call), not from anything in this project — and the call must come back as a `tool_use` block
with the right name and input and no markup in any text; the tool result sent back must render
and the next turn must answer.

Nothing here names a family: a template added to the fixtures is tested the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from engine_helpers import messages_tool
from real_templates import (
    ANSWER,
    BASH_TOOL,
    CAPTURED,
    COUNTED_FIELDS,
    REASONING,
    TEMPLATES,
    FamilyModel,
    answer_script,
    captured,
    post,
    script_call,
    scripted_reasoning_and_call,
    served_family,
)
from stream_grammar import check_stream

from mlxlaunch.protocol.sse import parse_frames

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

FAMILIES_DIR = "real-families"


@pytest.fixture(scope="module", params=TEMPLATES, ids=[p.stem for p in TEMPLATES])
def family_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyModel]:
    with served_family(Path(request.param), tmp_path_factory.mktemp(FAMILIES_DIR)) as model:
        yield model


def test_captured_requests_answer_streaming_and_not(family_model: FamilyModel) -> None:
    for name in CAPTURED:
        body = captured(name)
        body["max_tokens"] = 8
        counted = post(
            family_model,
            "/v1/messages/count_tokens",
            {k: v for k, v in body.items() if k in COUNTED_FIELDS},
        )
        assert counted.status_code == 200, counted.text
        expected = counted.json()["input_tokens"]

        answer = post(family_model, "/v1/messages", {**body, "stream": False})
        assert answer.status_code == 200, (name, answer.text)
        usage = answer.json()["usage"]
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == expected, name

        streamed = post(family_model, "/v1/messages", {**body, "stream": True})
        assert streamed.status_code == 200, (name, streamed.text)
        frames = list(parse_frames(streamed.text))
        check_stream(frames)
        final = [f.json() for f in frames if f.event == "message_delta"][-1]
        assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
        usage = final["usage"]
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == expected, name


def test_every_tool_is_in_the_prompt(family_model: FamilyModel) -> None:
    """No template silently drops the tools Claude Code offers."""
    body = captured("print-mode-request")
    fields = {"model": "m", "messages": body["messages"], "system": body["system"]}
    with_tools = post(family_model, "/v1/messages/count_tokens", {**fields, "tools": body["tools"]})
    without = post(family_model, "/v1/messages/count_tokens", fields)
    described = sum(len(json.dumps(t)) for t in body["tools"])
    added = with_tools.json()["input_tokens"] - without.json()["input_tokens"]
    # The definitions are ~30k characters: thousands of tokens, not a few hundred.
    assert added > described // 20, added


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_family_tool_call_round_trip(family_model: FamilyModel, split: bool) -> None:
    client = family_model.client
    example = family_model.facts["tool_call"]["example"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the source files."}]
    script_call(family_model, split)
    with client.messages.stream(
        model="m", max_tokens=300, messages=messages, tools=[BASH_TOOL]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1, final.content
    call = calls[0]
    assert call.name == example["name"]
    assert call.input == example["arguments"]
    assert call.id.startswith("toolu_")
    assert final.stop_reason == "tool_use"
    texts = [b.text for b in final.content if b.type == "text"] + [
        b.thinking for b in final.content if b.type == "thinking"
    ]
    for text in texts:
        for token in family_model.markup():
            assert token not in text, (token, text)
    partial = "".join(
        getattr(e.delta, "partial_json", "") for e in events if e.type == "content_block_delta"
    )
    assert json.loads(partial) == example["arguments"]

    # Not streaming: the same call from the same tokens.
    script_call(family_model, split)
    message = client.messages.create(
        model="m", max_tokens=300, messages=messages, tools=[BASH_TOOL]
    )
    (again,) = [b for b in message.content if b.type == "tool_use"]
    assert (again.name, again.input) == (call.name, call.input)

    # The result goes back; the template renders it and the next turn answers.
    family_model.scripted.enqueue(answer_script(family_model))
    follow_up = [
        *messages,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "a.py\nb.py"},
                {"type": "text", "text": "Now summarise."},
            ],
        },
    ]
    answer = client.messages.create(model="m", max_tokens=60, messages=follow_up, tools=[BASH_TOOL])
    assert answer.stop_reason == "end_turn"
    assert "".join(b.text for b in answer.content if b.type == "text") == ANSWER
    # A family whose model writes call ids gets back exactly the id it wrote, so the next
    # turn renders the call as generated and reuses all of it from the prefix cache.
    written = family_model.facts["tool_call"]
    if split is False and written["example"]["id"] in written["assistant_turn_as_rendered"]:
        first = message.usage
        before = first.input_tokens + (first.cache_read_input_tokens or 0) + first.output_tokens
        assert (answer.usage.cache_read_input_tokens or 0) >= before - 2


def test_reasoning_comes_back_as_thinking(family_model: FamilyModel) -> None:
    script = scripted_reasoning_and_call(family_model)
    if script is None:
        pytest.skip("this family writes no reasoning")
    tokenizer = family_model.tokenizer
    end = family_model.facts["tool_call"]["turn_ends_with"]
    ids = tokenizer.encode(script, add_special_tokens=False)
    family_model.scripted.enqueue(tokens=[*ids, *tokenizer.encode(end, add_special_tokens=False)])
    message = family_model.client.messages.create(
        model="m",
        max_tokens=300,
        messages=[{"role": "user", "content": "List the source files."}],
        tools=[BASH_TOOL],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    thinking = [b.thinking for b in message.content if b.type == "thinking"]
    assert [t.strip() for t in thinking] == [REASONING]
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.input == family_model.facts["tool_call"]["example"]["arguments"]
    for block in message.content:
        text = getattr(block, "text", "") or getattr(block, "thinking", "")
        assert not any(token in text for token in family_model.markup()), block


def hard_conversation(call_ids: tuple[str, str]) -> list[dict[str, Any]]:
    """What a long Claude Code session sends: reasoning, text and two parallel calls in one
    assistant turn, a user turn of [tool_result, tool_result, text], a mid-conversation system
    turn, and consecutive user turns."""
    first, second = call_ids
    return [
        {"role": "user", "content": "Look at the project."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Two reads at once.", "signature": "s"},
                {"type": "text", "text": "I will read both files."},
                {"type": "tool_use", "id": first, "name": "Bash", "input": {"command": "ls"}},
                {
                    "type": "tool_use",
                    "id": second,
                    "name": "Bash",
                    "input": {"command": "cat README.md"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": first, "content": "a.py\nb.py"},
                {"type": "tool_result", "tool_use_id": second, "content": "# Project"},
                {"type": "text", "text": "Also check the tests."},
            ],
        },
        {"role": "system", "content": "Keep answers short."},
        {"role": "user", "content": "And the docs."},
    ]


def test_the_hardest_conversation_is_served(family_model: FamilyModel) -> None:
    family_model.scripted.enqueue(answer_script(family_model))
    payload = {
        "model": "m",
        "max_tokens": 60,
        "system": "You are a coding agent.",
        "messages": hard_conversation(("toolu_01A09q90qw90lq917835lq9", "toolu_01B7yt5Kp3xq")),
        "tools": [BASH_TOOL],
    }
    answer = post(family_model, "/v1/messages", payload)
    assert answer.status_code == 200, answer.text
    text = "".join(b["text"] for b in answer.json()["content"] if b["type"] == "text")
    assert text == ANSWER


BOUNDED = messages_tool(
    "Bash",
    "Run a shell command",
    {
        "command": {"type": "string", "maxLength": 12},
        "timeout": {"type": "integer", "minimum": 1, "maximum": 600},
    },
    closed=True,
)


def test_a_forced_call_is_a_valid_call(family_model: FamilyModel) -> None:
    """The random model under tool_choice any: a call in the family's own syntax whose input
    matches the schema (grammar-enforced), read back by the family's parser."""
    message = family_model.client.messages.create(
        model="m",
        max_tokens=200,
        messages=[{"role": "user", "content": "Run something."}],
        tools=[BOUNDED],
        tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
    )
    assert message.stop_reason == "tool_use", message
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "Bash"
    jsonschema.validate(call.input, BOUNDED["input_schema"])
