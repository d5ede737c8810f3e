"""Honest prefix-cache diagnostics: prefix_hit | partial | fresh with the reused fraction, miss
logs with positions and digests (short excerpts only under --debug-cache), and misses inside
the last turn (a generation prompt that opens a think block) found against what the cache
held: the prompt and its output."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pytest
from engine_helpers import FakeClock, served_engine

from mlxlaunch.engine.cache.misses import (
    EXCERPT_CHARS,
    MIN_SHARED_TOKENS,
    MISS_LOG_REPEAT_S,
    REUSE_SEAM_TOKENS,
    MissTracker,
    classify,
)
from mlxlaunch.engine.types import Admitted
from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.server.streaming import cache_headers, reused_fraction

MISS_LOGGER = "mlxlaunch.engine"


class WordTokenizer:
    """Words, single newlines and markup as tokens: context-free, so what re-tokenises
    differently is only what renders differently."""

    PIECES = re.compile(r"</?think>|<\|\w+\|>|\n| ?\w+| ?[^\w\s]| ")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in self.PIECES.findall(text):
            if piece not in self.ids:
                self.ids[piece] = len(self.pieces)
                self.pieces.append(piece)
            out.append(self.ids[piece])
        assert self.decode(out) == text
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def tracker(
    tokenizer: WordTokenizer, clock: FakeClock | None = None, *, excerpts: bool = False
) -> MissTracker:
    return MissTracker(tokenizer.decode, clock=clock or FakeClock(), excerpts=excerpts)


def words(n: int, start: int = 0) -> str:
    return "".join(f" w{i}" for i in range(start, start + n))


# --- classification -------------------------------------------------------------------------


def test_reuse_is_classified_against_what_the_nearest_sequence_covered() -> None:
    assert classify(0, 0) == classify(0, 5000) == "fresh"
    assert classify(5000, 5000) == classify(5000 - REUSE_SEAM_TOKENS, 5000) == "prefix_hit"
    assert classify(5000 - REUSE_SEAM_TOKENS - 1, 5000) == "partial"
    assert classify(30, 10_000) == "partial"


def test_headers_carry_the_judgement_and_the_reused_fraction() -> None:
    partial = Admitted(
        "r", prompt_tokens=1000, cached_tokens=300, max_tokens=8, cache_reuse="partial"
    )
    assert cache_headers(partial) == {
        "x-cached-tokens": "300",
        "x-session-cache": "partial",
        "x-cache-reused": "0.300",
    }
    # An engine that does not judge: reuse alone decides, as before.
    assert cache_headers(Admitted("r", 40, 39, 8))["x-session-cache"] == "prefix_hit"
    assert cache_headers(Admitted("r", 40, 0, 8))["x-cache-reused"] == "0.000"
    # Rounded down: one token is always prefilled, so a prompt is never 1.000 reused.
    assert reused_fraction(99_999, 100_000) == "0.999" and reused_fraction(5, 0) == "0.000"
    assert cache_headers(None) == {}


def test_a_conversation_continuing_prompt_and_output_is_a_prefix_hit() -> None:
    tok = WordTokenizer()
    misses = tracker(tok)
    first = tok.encode("<|system|>" + words(300) + "<|user|> fix it<|assistant|>")
    assert misses.observe(first, cached_tokens=0, request_id="a", kind="main") is None
    assert misses.reuse_of("a", 0) == "fresh"
    output = tok.encode(words(200, 1000) + "<|end|>")
    misses.held(first + output)
    second = first + output + tok.encode("<|user|> thanks<|assistant|>")
    cached = len(first + output) - 1  # the end-of-turn token re-tokenised: within the seam
    assert misses.observe(second, cached_tokens=cached, request_id="b", kind="main") is None
    assert misses.reuse_of("b", cached) == "prefix_hit"
    assert misses.judged is not None and misses.judged.covered_tokens == len(first + output)


def test_an_early_change_is_partial_with_a_miss_and_eviction_is_partial_without() -> None:
    tok = WordTokenizer()
    misses = tracker(tok, excerpts=True)
    first = tok.encode("<|system|>" + words(40) + " Today is Monday." + words(400, 40))
    misses.observe(first, cached_tokens=0, request_id="a", kind="main")
    changed = tok.encode("<|system|>" + words(40) + " Today is Tuesday." + words(400, 40))
    report = misses.observe(changed, cached_tokens=43, request_id="b", kind="main")
    assert report is not None and report.position == 43 > MIN_SHARED_TOKENS
    assert report.excerpts is not None
    assert report.excerpts.cached.startswith(" Monday")
    assert report.excerpts.request.startswith(" Tuesday")
    assert misses.reuse_of("b", 43) == "partial" and misses.last == report
    # Same prompt again, but the cache gave only part of it: partial, and no divergence.
    assert misses.observe(changed, cached_tokens=100, request_id="c", kind="main") is None
    assert misses.reuse_of("c", 100) == "partial"
    # A prompt unrelated to any earlier one reused what it could.
    other = tok.encode("<|other|> hello" + words(100, 5000))
    misses.observe(other, cached_tokens=1, request_id="d", kind="title")
    assert misses.reuse_of("d", 1) == "prefix_hit"
    # A request the cache never looked up is judged by its reuse alone.
    assert misses.reuse_of("not-observed", 0) == "fresh"


# --- a generation prompt that opens a think block -----------------------------------------

# Generation prompt ends `<think>\n`; an assistant turn renders `<think>\nR\n</think>\n\ntext`
# (a family like MiniMax-M2 drops the reasoning once a user message follows it: `drop`).
THINK_TEMPLATE = jinja2.Environment().from_string(
    "<|system|>{{ system }}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>{{ m.content }}"
    "{%- else -%}<|assistant|>"
    "{%- if m.reasoning and not (drop and not loop.last) -%}"
    "{{ '<think>\\n' ~ m.reasoning ~ '\\n</think>\\n\\n' }}"
    "{%- endif -%}{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|><think>\\n' }}{%- endif -%}"
)
REASONING = "The user wants the bug fixed" + words(60, 7000)
ANSWER = " Done:" + words(170, 8000)


def render(messages: list[dict[str, str]], *, drop: bool, generation: bool) -> str:
    return THINK_TEMPLATE.render(
        system=words(200), messages=messages, drop=drop, add_generation_prompt=generation
    )


@pytest.mark.parametrize(
    ("written", "drop"),
    [
        # The model ends its reasoning with a blank line; history strips it.
        (REASONING + "\n\n</think>\n\n" + ANSWER, False),
        # The reasoning is written as the template writes it, but dropped from history.
        (REASONING + "\n</think>\n\n" + ANSWER, True),
    ],
    ids=["rendered-differently", "reasoning-dropped"],
)
def test_a_loss_inside_the_reply_after_an_opened_think_block_is_a_miss(
    written: str, drop: bool
) -> None:
    tok = WordTokenizer()
    misses = tracker(tok)
    history = [{"role": "user", "content": " Fix the bug."}]
    prompt = tok.encode(render(history, drop=drop, generation=True))
    assert render(history, drop=drop, generation=True).endswith("<think>\n")
    misses.observe(prompt, cached_tokens=0, request_id="a", kind="main")
    output = tok.encode(written) + tok.encode("<|end|>")
    misses.held(prompt + output)  # the cache keeps the prompt and the reply

    history += [
        {"role": "assistant", "reasoning": REASONING, "content": ANSWER},
        {"role": "user", "content": " Thanks."},
    ]
    if not drop:
        assert "<think>\n" + REASONING + "\n</think>\n\n" + ANSWER in render(
            history, drop=drop, generation=True
        )
    nxt = tok.encode(render(history, drop=drop, generation=True))
    held = prompt + output
    shared = next(i for i, (a, b) in enumerate(zip(held, nxt, strict=False)) if a != b)
    # Against the prompt alone this is a conversation moving on: the divergence lies in the
    # prompt's last tokens (`<think>\n`) or past its end, inside the reply.
    assert shared >= len(prompt) - 2
    report = misses.observe(nxt, cached_tokens=shared, request_id="b", kind="main")
    assert report is not None and report.position == shared
    assert report.nearest_tokens == len(held)
    judged = misses.judged
    assert judged is not None and judged.lost_tokens >= 168
    assert judged.lost_tokens == min(len(held), len(nxt) - 1) - shared
    assert judged.reuse == "partial"


# --- logging --------------------------------------------------------------------------------


def broken_prefix(tok: WordTokenizer, day: str, secret: str = "") -> list[int]:
    return tok.encode("<|system|>" + words(30) + f" Today is {day}." + secret + words(600, 30))


def test_a_miss_carries_positions_and_digests_but_no_text_by_default() -> None:
    tok = WordTokenizer()
    decoded: list[list[int]] = []

    def decode(ids: list[int]) -> str:
        decoded.append(ids)
        return tok.decode(ids)

    misses = MissTracker(decode, clock=FakeClock())
    secret = " the password is hunter2"
    misses.observe(broken_prefix(tok, "Monday", secret), cached_tokens=0, request_id="a", kind="")
    report = misses.observe(
        broken_prefix(tok, "Tuesday", secret), cached_tokens=33, request_id="b", kind="main"
    )
    assert report is not None and report.position == 33 and report.excerpts is None
    assert not decoded  # no prompt text is even decoded
    digests = report.digests
    assert all(re.fullmatch(r"[0-9a-f]{8}", d) for d in (digests.before, digests.cached))
    assert digests.cached != digests.request
    # The same change again (a timestamp each turn): the same digests, so one can tell.
    again = misses.observe(
        broken_prefix(tok, "Tuesday", secret), cached_tokens=33, request_id="c", kind="main"
    )
    assert again is None  # it continues b: no miss
    other = misses.observe(
        broken_prefix(tok, "Friday", secret), cached_tokens=33, request_id="d", kind="main"
    )
    assert other is not None and other.digests.before == digests.before
    assert other.digests.request not in (digests.cached, digests.request)
    # Keyed by the process: another server's digests of the same text differ.
    elsewhere = MissTracker(tok.decode, clock=FakeClock())
    elsewhere.observe(
        broken_prefix(tok, "Monday", secret), cached_tokens=0, request_id="a", kind=""
    )
    moved = elsewhere.observe(
        broken_prefix(tok, "Tuesday", secret), cached_tokens=33, request_id="b", kind="main"
    )
    assert moved is not None and moved.digests.cached != digests.cached


def test_large_misses_are_logged_with_digests_and_no_prompt_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=MISS_LOGGER)
    tok = WordTokenizer()
    misses = tracker(tok)
    secret = " the password is hunter2" + "\n" + " private" * 200
    misses.observe(
        broken_prefix(tok, "Monday", secret), cached_tokens=0, request_id="a", kind="main"
    )
    assert not caplog.records
    prompt = broken_prefix(tok, "Tuesday", secret)
    report = misses.observe(prompt, cached_tokens=33, request_id="req_b", kind="main")
    assert report is not None
    (record,) = caplog.records
    assert record.name.startswith(MISS_LOGGER) and record.levelno == logging.WARNING
    message = record.getMessage()
    assert "req_b" in message and "at token 33" in message
    assert f"{len(prompt) - 1 - 33} lost" in message
    assert f"cached #{report.digests.cached}" in message
    assert f"request #{report.digests.request}" in message
    for text in ("Monday", "Tuesday", "Today", "hunter2", "private", " w1"):
        assert text not in message


def test_under_debug_cache_misses_are_logged_with_short_escaped_excerpts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=MISS_LOGGER)
    tok = WordTokenizer()
    misses = tracker(tok, excerpts=True)
    secret = "\n" + " private" * 200
    misses.observe(
        broken_prefix(tok, "Monday", secret), cached_tokens=0, request_id="a", kind="main"
    )
    prompt = broken_prefix(tok, "Tuesday", secret)
    report = misses.observe(prompt, cached_tokens=33, request_id="req_b", kind="main")
    assert report is not None and report.excerpts is not None
    (record,) = caplog.records
    message = record.getMessage()
    assert "req_b" in message and "at token 33" in message
    assert f"cached #{report.digests.cached}" in message  # digests as without the flag
    assert "\\n" in message and "\n" not in message  # escaped: one line per miss
    excerpts = report.excerpts
    assert excerpts.before.endswith("Today is") and excerpts.cached.startswith(" Monday")
    assert all(
        0 < len(text) <= EXCERPT_CHARS and repr(text) in message
        for text in (excerpts.before, excerpts.cached, excerpts.request)
    )
    assert message.count("private") <= 3 * (EXCERPT_CHARS // len(" private") + 1)


def test_small_losses_are_not_logged_and_repeats_are_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=MISS_LOGGER)
    tok = WordTokenizer()
    clock = FakeClock()
    misses = tracker(tok, clock)
    base = tok.encode("<|notes|>" + words(300))
    misses.observe(base, cached_tokens=0, request_id="a", kind="main")
    near_end = base[:-100] + tok.encode(words(100, 9000))
    assert misses.observe(near_end, cached_tokens=len(base) - 100, request_id="b", kind="main")
    assert not caplog.records  # a miss in stats, too small for the log

    # A timestamp early in the prompt, new each turn: the same divergence, turn after turn.
    for n in range(4):
        misses.observe(
            broken_prefix(tok, f"d{n}"), cached_tokens=33, request_id=f"t{n}", kind="main"
        )
    assert len(caplog.records) == 1
    clock.advance(MISS_LOG_REPEAT_S)
    misses.observe(broken_prefix(tok, "d9"), cached_tokens=33, request_id="t9", kind="main")
    assert len(caplog.records) == 2
    assert "(2 more like it since)" in caplog.records[-1].getMessage()


def test_a_side_request_or_a_modest_loss_logs_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=MISS_LOGGER)
    tok = WordTokenizer()
    misses = tracker(tok)
    misses.observe(broken_prefix(tok, "Monday"), cached_tokens=0, request_id="a", kind="main")
    misses.observe(broken_prefix(tok, "Friday"), cached_tokens=33, request_id="s", kind="subagent")
    assert [r.levelno for r in caplog.records] == [logging.INFO]


# --- over HTTP ------------------------------------------------------------------------------

TOKEN = "diagnostics-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
OPENING = "You are a careful assistant who answers in one short sentence. "
SYSTEM = " ".join(f"Rule {i}: cite the file and line of every claim you make." for i in range(40))


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerHandle]:
    with served_engine(tiny_model_dir, TOKEN) as (_, handle):
        yield handle


def ask(server: ServerHandle, system: str, question: str) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4,
        "temperature": 0,
        "system": system,
        "messages": [{"role": "user", "content": question}],
    }
    response = httpx.post(
        server.url + "/v1/messages", content=json.dumps(body), headers=HEADERS, timeout=60
    )
    assert response.status_code == 200, response.text
    return response


@pytest.mark.slow
def test_a_request_that_loses_most_of_its_prefix_is_partial_and_logged(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=MISS_LOGGER)
    first = ask(server, OPENING * 2 + "Session 1. " + SYSTEM, "What is a trie?")
    assert first.headers["x-session-cache"] == "fresh"
    assert first.headers["x-cache-reused"] == "0.000"
    again = ask(server, OPENING * 2 + "Session 1. " + SYSTEM, "What is a heap?")
    assert again.headers["x-session-cache"] == "prefix_hit"

    changed = ask(server, OPENING * 2 + "Session 2. " + SYSTEM, "What is a heap?")
    usage = changed.json()["usage"]
    cached, prompt = usage["cache_read_input_tokens"], usage["input_tokens"]
    prompt += cached
    assert changed.headers["x-session-cache"] == "partial"
    assert int(changed.headers["x-cached-tokens"]) == cached > MIN_SHARED_TOKENS
    assert changed.headers["x-cache-reused"] == reused_fraction(cached, prompt)
    assert float(changed.headers["x-cache-reused"]) < 0.2

    message_id = changed.json()["id"]
    lines = [r.getMessage() for r in caplog.records if message_id in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    line = lines[0]
    assert f"at token {cached}" in line and f"{prompt - 1 - cached} lost" in line
    assert re.search(r"before #[0-9a-f]{8}, cached #[0-9a-f]{8}, request #[0-9a-f]{8}", line)
    # No prompt text at all (the server runs without --debug-cache): not one word of it.
    for word in ("Session", "Rule", "careful", "cite", "heap"):
        assert word not in line
    assert len(line) < 300
