"""Which prompts the batch prefills together: only prompts of about the same shape.

Rows prefilled together are padded to the longest slice and the deepest cache (and take the
masked attention path), so Claude Code's main turn (a short slice on a deep cached session)
beside a session title (a short slice on an empty cache) cost 2.2 s where the main turn alone
took 0.27 s, and `mlx bench --small-model` showed the main turn's first token 10-20x later with
four side streams on one model. Now a prompt joins the ones being prefilled only where the
padding adds at most PAD_LIMIT to their work; the main loop's (urgent) prompt goes first.

Structure only, on a real mlx-lm model with random weights (tests/small_models.py): which
prompts each step prefilled, and that the tokens are those of each prompt alone.
"""

from __future__ import annotations

import random
from typing import Any

import mlx.core as mx
import pytest
from small_models import fresh_cache, random_qwen3

from mlxlaunch.engine.scheduling.batch import Batch

SESSION = 1500  # tokens of the main loop's cached session
SLICE = 64


@pytest.fixture(scope="module")
def model() -> Any:
    return random_qwen3()


def tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(96) for _ in range(count)]


def cached(model: Any, held: list[int]) -> list[Any]:
    """A cache holding `held`, as the prefix cache hands one over."""
    cache = fresh_cache(model)
    if held:
        model(mx.array([held]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def run(
    model: Any, requests: list[tuple[list[int], list[int], bool]], *, max_tokens: int = 4
) -> tuple[list[set[int]], dict[int, list[int]]]:
    """Insert every (held, prompt, urgent) request at once and step until all are done: the
    uids each step prefilled, and each uid's tokens."""
    batch = Batch(model, stop_tokens=(), width=8, prefill_chunk=SLICE)
    outputs: dict[int, list[int]] = {}
    for held, prompt, urgent in requests:
        uid = batch.insert(
            prompt, max_tokens=max_tokens, cache=cached(model, held), held=held, urgent=urgent
        )
        outputs[uid] = []
    steps: list[set[int]] = []
    while any(len(out) < max_tokens for out in outputs.values()):
        progress, emitted = batch.step(SLICE)
        steps.append({p.uid for p in progress if not p.ended})
        for event in emitted:
            outputs[event.uid] += event.tokens
        assert len(steps) < 100
    return [s for s in steps if s], outputs


def alone(model: Any, held: list[int], prompt: list[int], urgent: bool = False) -> list[int]:
    _, outputs = run(model, [(held, prompt, urgent)])
    [out] = outputs.values()
    return out


@pytest.mark.slow
def test_the_main_turn_prefills_alone_then_the_titles_together(model: Any) -> None:
    session = tokens(0, SESSION)
    main = (session, tokens(1, 40), True)
    titles = [([], tokens(10 + i, 30), False) for i in range(3)]
    steps, outputs = run(model, [*titles, main])  # the titles came first
    main_uid, title_uids = 3, {0, 1, 2}
    assert steps[0] == {main_uid}  # urgent first, and alone: no title padded to its depth
    assert steps[1] == title_uids  # the titles of one shape in one pass
    assert outputs[main_uid] == alone(model, *main)
    for uid, title in enumerate(titles):
        assert outputs[uid] == alone(model, *title)


@pytest.mark.slow
def test_a_title_waits_for_a_deep_prompt_and_is_not_passed_by_later_ones(model: Any) -> None:
    """A side prompt that would pad badly waits for the prompts being prefilled; the ones
    queued behind it wait too, so it is never passed for ever."""
    deep = (tokens(2, SESSION), tokens(3, 3 * SLICE), False)  # a subagent's long prompt
    title = ([], tokens(4, 30), False)
    later = (tokens(5, SESSION), tokens(6, 10), False)  # deep, but after the title
    steps, _ = run(model, [deep, title, later])
    first_title = next(i for i, s in enumerate(steps) if 1 in s)
    assert all(s == {0} for s in steps[:first_title])  # the deep prompt alone until done
    assert 2 not in set().union(*steps[:first_title])  # nobody passed the title


def test_an_urgent_prompt_joins_a_long_prefill_rather_than_wait_for_it(model: Any) -> None:
    """The main loop does not wait behind a long prompt that has more than a slice left."""
    deep = ([], tokens(7, 6 * SLICE), False)
    batch = Batch(model, stop_tokens=(), width=8, prefill_chunk=SLICE)
    first = batch.insert(deep[1], max_tokens=2, cache=cached(model, []), held=[])
    progress, _ = batch.step(SLICE)
    assert [p.uid for p in progress] == [first]
    session = tokens(8, SESSION)
    main = batch.insert(
        tokens(9, 20), max_tokens=2, cache=cached(model, session), held=session, urgent=True
    )
    progress, _ = batch.step(SLICE)
    assert {p.uid for p in progress} == {first, main}
