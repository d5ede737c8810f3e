"""The prefix cache holds under every REAL chat template through a Claude Code session.

The session is the one that costs most when the cache misses: a user prompt, three tool
rounds, a NEW user prompt, two tool rounds, another NEW user prompt — with Claude Code's real
system prompt and tools, thinking blocks in the assistant turns (sent back as Claude Code
sends them) and a mid-conversation system turn. The assistant turns are what the model wrote:
each reply is scripted in the family's own syntax (from the fixture) and its content blocks go
back in the next request. Every turn must re-prefill at most `SEAM_TOKENS` of the previous
prompt, new user prompts included; and greedy output with the cache equals output without it.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_templates import (
    ANSWER,
    TEMPLATES,
    FamilyModel,
    answer_script,
    captured,
    model_output_of_call,
    post,
    scripted_reasoning_and_call,
    served_family,
)

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

# Re-tokenising where a rendered turn meets the next one may shift a few tokens; beyond this
# a turn lost part of the previous prompt.
SEAM_TOKENS = 64
THINKING = {"type": "enabled", "budget_tokens": 2048}


@pytest.fixture(scope="module", params=TEMPLATES, ids=[p.stem for p in TEMPLATES])
def family_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyModel]:
    with served_family(Path(request.param), tmp_path_factory.mktemp("cache-families")) as model:
        yield model


def enqueue(model: FamilyModel, text: str) -> None:
    tokenizer = model.tokenizer
    end = model.facts["tool_call"]["turn_ends_with"]
    ids = tokenizer.encode(text, add_special_tokens=False)
    model.scripted.enqueue(tokens=[*ids, *tokenizer.encode(end, add_special_tokens=False)])


def call_script(model: FamilyModel) -> str:
    """A tool call with reasoning before it, where the family writes reasoning."""
    return scripted_reasoning_and_call(model) or model_output_of_call(model)[0]


def content_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant turn as Claude Code sends it back: every block, thinking included."""
    return [dict(block) for block in message["content"]]


def session_base() -> dict[str, Any]:
    body = captured("print-mode-request")
    return {
        "model": body["model"],
        "system": body["system"],
        "tools": body["tools"],
        "max_tokens": 400,
        "thinking": THINKING,
    }


def run_session(model: FamilyModel) -> list[dict[str, int]]:
    """The session, turn by turn; per request: prompt tokens, cached tokens, output tokens."""
    base = session_base()
    first_prompt = captured("print-mode-request")["messages"][0]
    messages: list[dict[str, Any]] = [
        copy.deepcopy(first_prompt),
        {"role": "system", "content": "The user prefers short answers."},
    ]
    # Per user prompt: how many tool rounds before the answer.
    plan = [("", 3), ("Now look at the tests, please.", 2), ("Thanks. Summarise in a line.", 0)]
    usages: list[dict[str, int]] = []
    for prompt, rounds in plan:
        if prompt:
            messages.append({"role": "user", "content": prompt})
        for step in range(rounds + 1):
            enqueue(model, call_script(model) if step < rounds else answer_script(model))
            answer = post(model, "/v1/messages", {**base, "messages": messages})
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            usage = reply["usage"]
            usages.append(
                {
                    "prompt": usage["input_tokens"] + usage["cache_read_input_tokens"],
                    "cached": usage["cache_read_input_tokens"],
                    "output": usage["output_tokens"],
                }
            )
            messages.append({"role": "assistant", "content": content_of(reply)})
            calls = [b for b in reply["content"] if b["type"] == "tool_use"]
            if step < rounds:
                assert len(calls) == 1, reply
                result = {"type": "tool_result", "tool_use_id": calls[0]["id"]}
                messages.append({"role": "user", "content": [{**result, "content": "ok"}]})
            else:
                assert not calls and ANSWER in str(reply["content"]), reply
    model.last_session = messages  # type: ignore[attr-defined]
    return usages


def test_every_turn_reuses_the_previous_prompt(family_model: FamilyModel) -> None:
    usages = run_session(family_model)
    lost = [
        previous["prompt"] - current["cached"] for previous, current in itertools.pairwise(usages)
    ]
    print(family_model.family.name, "re-prefilled per turn:", lost, "usages:", usages)
    assert max(lost) <= SEAM_TOKENS, (family_model.family.name, lost)
    reuse = sum(u["cached"] for u in usages[1:]) / sum(u["prompt"] for u in usages[1:])
    assert reuse >= 0.99, reuse


def test_greedy_output_is_the_same_with_and_without_the_cache(
    family_model: FamilyModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_session(family_model)
    messages = [*family_model.last_session, {"role": "user", "content": "One more thing?"}]  # type: ignore[attr-defined]
    body = {**session_base(), "messages": messages, "max_tokens": 12, "temperature": 0}
    body.pop("thinking")
    cached = post(family_model, "/v1/messages", body).json()
    assert cached["usage"]["cache_read_input_tokens"] > 0
    template = next(p for p in TEMPLATES if p.stem == family_model.family.name)
    # The served session's replies are rendered back as the model's own token ids
    # (`PromptRenderer.adopt`); a fresh server must hold the same history to get the same
    # prompt ids, so that only the KV reuse differs between the two.
    adopted = _adopted_replies(family_model)
    with served_family(template, tmp_path_factory.mktemp("no-cache"), cache_memory_bytes=0) as cold:
        post(cold, "/v1/messages/count_tokens", {"model": "m", "messages": HELLO})  # loads it
        renderer = cold.engine._worker.renderer
        assert renderer is not None
        for ids in adopted:
            renderer.adopt(ids)
        fresh = post(cold, "/v1/messages", body).json()
    assert fresh["usage"]["cache_read_input_tokens"] == 0
    assert fresh["content"] == cached["content"]


HELLO = [{"role": "user", "content": "hello"}]


def _adopted_replies(model: FamilyModel) -> list[list[int]]:
    """The replies a server remembered as the model's own token ids (entries without line
    offsets are the adopted ones; see `IncrementalTokenizer.adopt`)."""
    renderer = model.engine._worker.renderer
    assert renderer is not None
    entries = renderer.encoder._entries.values()
    return [list(entry.ids) for entry in entries if entry.offsets is None]
