"""Reasoning continuity for stateless clients (issue 33): Codex's `store: false` loop with
`include: ["reasoning.encrypted_content"]` gets each turn's reasoning sealed by this server,
and the sealed reasoning it sends back renders exactly as generated, so the next turn reuses
the cached prefix instead of re-prefilling from the first reasoning item.

The seal itself is checked alone (quick); the loop runs through the real server on a tiny
model with Qwen3's real chat template (it renders an earlier turn's reasoning), its replies
scripted (reasoning, then a call), and the reuse comes from the server's own usage figures.
"""

from __future__ import annotations

import itertools
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_templates import FIXTURES, served_family

from mlxlaunch.bench.workloads import tool_result_text
from mlxlaunch.server.sealed_reasoning import (
    INCLUDE_NAME,
    SEAL_PREFIX,
    ForgedSeal,
    ReasoningSeal,
)

QWEN3 = FIXTURES / "chat-templates" / "qwen3-0.6b.jinja"
THOUGHT = "The files are under src/, so I list them before reading any of them."
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


def test_a_seal_opens_only_here_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    seal = ReasoningSeal()
    text = "I read the file first.\n\nThen I edit it — carefully."
    sealed = seal.seal(text)
    assert sealed.startswith(SEAL_PREFIX) and text not in sealed
    assert seal.open(sealed) == text
    assert seal.open(None) is None and seal.open("gAAAA-another-servers") is None
    with pytest.raises(ForgedSeal):
        ReasoningSeal().open(sealed)  # another key: not readable
    tampered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    with pytest.raises(ForgedSeal):
        seal.open(tampered)
    kept = tmp_path / "keys" / "reasoning.key"
    first = ReasoningSeal.kept_in(kept)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert ReasoningSeal.kept_in(kept).open(first.seal(text)) == text  # after a restart


def _script(model: Any) -> None:
    model.scripted.enqueue(
        f'<think>\n{THOUGHT}\n</think>\n\n<tool_call>\n{{"name": "shell", "arguments": '
        '{"command": "ls src"}}\n</tool_call>'
    )


def codex_loop(model: Any, *, sealed: bool, turns: int = 10) -> list[tuple[int, int]]:
    """`turns` requests as Codex sends them with `store: false`: the whole history each time,
    reasoning items sent back with their summary dropped (the worst case: only the sealed
    content carries the reasoning). (prompt tokens, cached tokens) of each turn."""
    url = model.server.url + "/v1/responses"
    items: list[dict[str, Any]] = [{"role": "user", "content": "List the source files."}]
    figures = []
    for turn in range(turns):
        _script(model)
        body = {
            "model": "m", "input": items, "tools": TOOLS, "store": False, "max_output_tokens": 80,
            "reasoning": {"effort": "medium"}, "include": [INCLUDE_NAME] if sealed else [],
        }  # fmt: skip
        reply = httpx.post(url, json=body, headers={"x-api-key": "x"}, timeout=300)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        usage = answer["usage"]
        figures.append((usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]))
        for item in answer["output"]:
            if item["type"] == "reasoning":
                assert (item.get("encrypted_content") or "").startswith(SEAL_PREFIX) == sealed
                items.append({**item, "summary": []})
            elif item["type"] == "function_call":
                items.append(item)
                output = tool_result_text(turn, 600)
                items.append(
                    {"type": "function_call_output", "call_id": item["call_id"], "output": output}
                )
    return figures


def reply_reused(figures: list[tuple[int, int]]) -> list[int]:
    """Each later turn's cached tokens beyond the whole prompt of the turn before: how much of
    the earlier reply (its reasoning, its call) came from the cache instead of a prefill."""
    return [cached - before for (before, _), (_, cached) in itertools.pairwise(figures)]


@pytest.mark.slow
def test_a_ten_turn_codex_loop_reuses_its_prefix_through_the_sealed_reasoning(
    tmp_path: Path,
) -> None:
    with served_family(QWEN3, tmp_path) as model:
        thought = len(model.tokenizer.encode(THOUGHT, add_special_tokens=False))
        sealed = codex_loop(model, sealed=True)
    with served_family(QWEN3, tmp_path / "again") as model:
        plain = codex_loop(model, sealed=False)
    with_seal, without = reply_reused(sealed), reply_reused(plain)
    print("reply tokens reused, sealed reasoning:  ", with_seal)
    print("reply tokens reused, reasoning dropped: ", without)
    print("tokens prefilled over 10 turns, sealed / dropped:",
          sum(p - c for p, c in sealed), sum(p - c for p, c in plain))  # fmt: skip
    # Sealed: every earlier reply, its reasoning included, comes from the cache.
    assert all(reused >= thought for reused in with_seal), sealed
    # Dropped: the reasoning is gone from the history, so the reply is prefilled again.
    assert all(reused < thought // 2 for reused in without), plain


@pytest.mark.slow
def test_a_changed_seal_is_a_400_naming_the_field(tmp_path: Path) -> None:
    with served_family(QWEN3, tmp_path) as model:
        _script(model)
        url = model.server.url + "/v1/responses"
        base = {"model": "m", "tools": TOOLS, "store": False, "include": [INCLUDE_NAME],
                "reasoning": {"effort": "medium"}, "max_output_tokens": 40}  # fmt: skip
        answer = httpx.post(url, json={**base, "input": "List the files."},
                            headers={"x-api-key": "x"}, timeout=300).json()  # fmt: skip
        [reasoning] = [i for i in answer["output"] if i["type"] == "reasoning"]
        forged = reasoning["encrypted_content"][:-8] + "AAAAAAAA"
        history = [{"role": "user", "content": "List the files."},
                   {**reasoning, "encrypted_content": forged}]  # fmt: skip
        refused = httpx.post(url, json={**base, "input": history},
                             headers={"x-api-key": "x"}, timeout=300)  # fmt: skip
        assert refused.status_code == 400, refused.text
        assert "input.1.encrypted_content" in refused.json()["error"]["message"]


@pytest.mark.slow
def test_conversations_under_different_cache_keys_keep_each_others_prefix(
    tiny_model_dir: Path,
) -> None:
    """Issue 33's `prompt_cache_key`: two Codex conversations taking turns, each under its
    own key, never evict each other's prefix while the cache's budget holds both, and each
    turn shows its key in /v1/stats."""
    from engine_helpers import serve

    with serve(tiny_model_dir) as served:
        url = served.server.url
        histories: dict[str, list[dict[str, Any]]] = {
            key: [{"role": "user", "content": f"Conversation {key}: " + tool_result_text(i, 900)}]
            for i, key in enumerate(("codex-a", "codex-b"))
        }
        last_prompt: dict[str, int] = {}
        for turn in range(3):
            for key, items in histories.items():
                served.scripted.enqueue(f"Turn {turn} of {key} is done.")
                body = {"model": "m", "input": items, "store": False, "prompt_cache_key": key,
                        "max_output_tokens": 12}  # fmt: skip
                answer = httpx.post(url + "/v1/responses", json=body, timeout=300).json()
                usage = answer["usage"]
                if key in last_prompt:  # everything it sent last time, the other one between
                    assert usage["input_tokens_details"]["cached_tokens"] >= last_prompt[key]
                last_prompt[key] = usage["input_tokens"]
                items += [*answer["output"], {"role": "user", "content": f"Next {turn}."}]
        recent = httpx.get(url + "/v1/stats", timeout=30).json()["recent"]
        assert [r["cache_key"] for r in recent[-2:]] == ["codex-a", "codex-b"]
        sessions = {
            s["key"]: s for s in httpx.get(url + "/v1/stats", timeout=30).json()["sessions"]
        }
        assert sessions["codex-a"]["turns"] == sessions["codex-b"]["turns"] == 3
