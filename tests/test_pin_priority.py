"""Issue 35, item 5: pins order blocks within a priority, never above the main session, and
hold at most their share of the budget.

A stored conversation that a client continues by id is pinned for its next turn; the main
session (Claude Code's or Codex's interactive loop) is not pinned but outranks every side
request. Measured in the issue: 40 stored side requests evicted a 6.2k-token main prefix
(6188 → 1 token cached). On the trie itself, then through the real server: 40 side requests on
/v1/responses (store defaults to true) and 40 message-thread creates, with the main session's
prefix cached before and after.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import mlx.core as mx
import openai
import pytest
from mlx_lm.models.cache import KVCache

from mlxlaunch.engine.cache.blocks import PIN_SHARE, BlockTrie
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

TOKEN_BYTES = 2 * 2 * 4 * 4  # keys and values, 2 heads of 4 float32 each
MAIN_TOKENS = 6188
SIDE_TOKENS = 300
PIN = 15 * 60.0


def _kv(tokens: int) -> list[Any]:
    cache = KVCache()
    cache.keys = mx.zeros((1, 2, tokens, 4))
    cache.values = mx.zeros((1, 2, tokens, 4))
    cache.offset = tokens
    return [cache]


def _side(number: int, tokens: int = SIDE_TOKENS) -> list[int]:
    return [100_000 + number * 10_000 + i for i in range(tokens)]


def test_pinned_side_requests_never_evict_the_main_sessions_prefix() -> None:
    trie = BlockTrie(budget_bytes=(MAIN_TOKENS + 3000) * TOKEN_BYTES, block_tokens=256)
    main = list(range(MAIN_TOKENS))
    trie.store(main, _kv(MAIN_TOKENS), priority=1)
    for number in range(40):  # each a stored answer, pinned for its continuation
        trie.store(_side(number), _kv(SIDE_TOKENS), 0, pinned_until=time.monotonic() + PIN)
    assert trie.match(main) == MAIN_TOKENS
    assert trie.nbytes <= trie.budget_bytes


def test_pins_hold_at_most_their_share_and_the_oldest_lapse_first() -> None:
    quarter = 1024
    trie = BlockTrie(budget_bytes=4 * quarter * TOKEN_BYTES, block_tokens=256)
    pinned = [_side(n, quarter) for n in range(4)]  # together the whole budget
    for tokens in pinned:
        trie.store(tokens, _kv(quarter), 0, pinned_until=time.monotonic() + PIN)
    assert PIN_SHARE == 0.5
    fresh = _side(9, 2 * quarter)  # an unpinned request still finds room
    trie.store(fresh, _kv(2 * quarter), 0)
    assert trie.match(fresh) == 2 * quarter
    assert [trie.match(tokens) for tokens in pinned] == [0, 0, quarter, quarter]


def test_a_pinned_conversation_outlives_newer_unpinned_ones_until_its_pin_ends() -> None:
    one_prompt = 64 * TOKEN_BYTES
    trie = BlockTrie(budget_bytes=2 * one_prompt, block_tokens=16)
    thread = list(range(1000, 1064))
    trie.store(thread, _kv(64), 1, pinned_until=time.monotonic() + 0.5)
    for seed in range(3):  # newer, main-priority conversations fill the budget twice over
        trie.store([seed * 100 + i for i in range(64)], _kv(64), 1)
    assert trie.match(thread) == 64
    time.sleep(0.6)  # the pin runs out: the thread is the oldest conversation again
    for seed in range(3, 5):
        trie.store([seed * 100 + i for i in range(64)], _kv(64), 1)
    assert trie.match(thread) == 0


# --- through the real server --------------------------------------------------------------

MAIN_SYSTEM = "You are an interactive agent that helps users with software engineering tasks."
TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


def _words(seed: int, count: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(count))


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Room for the main prefix and a few side requests, not for all 40 of them.
    engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_memory_bytes=4 * 1024 * 1024))
    engine.start()
    tmp = tmp_path_factory.mktemp("pins")
    handle: ServerHandle = start_server(engine, ServerSettings(threads_dir=tmp / "threads"))
    try:
        yield handle.url
    finally:
        handle.stop()
        engine.close()


def _main_turn(url: str, text: str) -> tuple[int, int]:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=300)
    message = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=1, system=MAIN_SYSTEM, tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": text}],
    )  # fmt: skip
    usage = message.usage
    return usage.input_tokens + (usage.cache_read_input_tokens or 0), (
        usage.cache_read_input_tokens or 0
    )


@pytest.mark.slow
@pytest.mark.parametrize("side", ["responses", "threads"])
def test_forty_side_conversations_leave_the_main_prefix_cached(server: str, side: str) -> None:
    text = _words(len(side), 1500)  # the main session's prompt, several thousand tokens
    prompt, _ = _main_turn(server, text)
    assert prompt > 4000
    responses = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)
    threads = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0, timeout=120)
    for number in range(40):
        if side == "responses":  # store defaults to true, as OpenAI's does
            responses.responses.create(
                model="local", input=_words(number, 600), max_output_tokens=16
            )
        else:
            threads.messages.create(
                model="claude-haiku-4-5", max_tokens=1,
                messages=[{"role": "user", "content": _words(number, 600)}],
                extra_body={"thread": {"type": "create"}},
            )  # fmt: skip
    again, cached = _main_turn(server, text)
    print(f"{side}: main prompt {again} tokens, {cached} cached after 40 side conversations")
    assert cached >= again - 256  # all of it but the last, partly filled block
