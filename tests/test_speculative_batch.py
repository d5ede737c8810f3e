"""Speculative decoding in the batch: exact under greedy decoding, the same distribution under
sampling, rollbacks that leave each sequence's KV as if the rejected drafts never happened.

The models are built in memory (tests/small_models.py): real mlx-lm qwen3 code with random
weights, whose output depends on the whole context, so a wrong rollback changes the tokens.
Random models repeat themselves, and prompts made of repeated runs give the prompt-lookup
drafter matches: drafts are proposed, some accepted and some rejected, and rows of one batch
accept different numbers of them (rows that end at different positions).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator
from small_models import fresh_cache, random_qwen3

from mlxlaunch.engine.decoding.drafting import Acceptance, DraftWidth, PromptLookup
from mlxlaunch.engine.decoding.sampling import Stateless, penalty_processors, resolve_sampling
from mlxlaunch.engine.decoding.thinking import ThinkingBudget
from mlxlaunch.engine.runtime.row_cache import RowKVCache
from mlxlaunch.engine.scheduling.batch import Batch, Counters
from mlxlaunch.engine.types import Sampling
from mlxlaunch.store.generation_config import SamplingDefaults


@pytest.fixture(scope="module")
def model() -> Any:
    return random_qwen3()


def generate(
    model: Any,
    prompts: Sequence[list[int]],
    max_tokens: int,
    *,
    speculate: bool,
    stagger: int = 0,
    processors: Any = None,
    sampler: Any = None,
    prefill_tokens: int = 16,
) -> tuple[list[list[int]], Counters]:
    """Each prompt's output through one Batch; `stagger`: insert one prompt every n steps."""
    ticks = itertools.count()  # every pass costs the same: drafting is tried where it may pay
    batch = Batch(
        model, stop_tokens=(), width=8, prefill_chunk=16, speculate=speculate,
        _clock=lambda: next(ticks) * 0.01,
    )  # fmt: skip
    waiting = list(enumerate(prompts))
    outputs: dict[int, list[int]] = {}
    order: dict[int, int] = {}
    steps = 0
    while waiting or any(len(out) < max_tokens for out in outputs.values()):
        if waiting and (stagger == 0 or steps % stagger == 0):
            index, prompt = waiting.pop(0)
            uid = batch.insert(
                prompt,
                max_tokens=max_tokens,
                cache=fresh_cache(model),
                held=[],
                sampler=sampler,
                processors=processors(index) if processors else (),
                drafter=PromptLookup() if speculate else None,
            )
            outputs[uid], order[uid] = [], index
        _, emitted = batch.step(prefill_tokens)
        steps += 1
        for event in emitted:
            outputs[event.uid] += event.tokens
        assert steps < 10 * max_tokens * len(prompts), "the batch stopped making progress"
    by_prompt = sorted(outputs, key=lambda uid: order[uid])
    return [outputs[uid] for uid in by_prompt], batch.counters


def repetitive_prompts(seed: int, count: int, vocab: int = 96) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        if rng.random() < 0.7:
            run = [rng.randrange(vocab) for _ in range(rng.randint(3, 9))]
            prompts.append(run * rng.randint(2, 10))
        else:
            prompts.append([rng.randrange(vocab) for _ in range(rng.randint(1, 60))])
    return prompts


# --- greedy: token for token -------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_greedy_speculation_gives_the_plain_output_token_for_token(model: Any, seed: int) -> None:
    prompts = repetitive_prompts(seed, count=1 + seed % 5)
    stagger = 3 if seed % 2 else 0
    plain, _ = generate(model, prompts, 60, speculate=False, stagger=stagger)
    speculative, counters = generate(model, prompts, 60, speculate=True, stagger=stagger)
    assert speculative == plain
    assert counters.drafted_tokens > 0  # the comparison covers drafted steps


def test_drafts_are_accepted_and_rejected_row_by_row(model: Any) -> None:
    """Several rows, each accepting a different number of drafts in the same passes (rows
    that end at different positions), against plain decoding."""
    prompts = repetitive_prompts(11, count=6)
    plain, _ = generate(model, prompts, 80, speculate=False)
    speculative, counters = generate(model, prompts, 80, speculate=True)
    assert speculative == plain
    assert 0 < counters.accepted_tokens < counters.drafted_tokens


def test_the_plain_batch_matches_mlx_lms_own_generator(model: Any) -> None:
    """The batch's own decoding (no drafts) is mlx-lm's `BatchGenerator`'s, token for token."""
    prompts = repetitive_prompts(5, count=5)
    ours, _ = generate(model, prompts, 40, speculate=False)
    generator = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    uids = generator.insert([list(p) for p in prompts], max_tokens=[40] * len(prompts))
    theirs: dict[int, list[int]] = {uid: [] for uid in uids}
    while any(len(v) < 40 for v in theirs.values()):
        for response in generator.next()[1]:
            theirs[response.uid].append(response.token)
    generator.close()
    assert ours == [theirs[uid] for uid in uids]


def test_each_accepted_draft_saves_a_step(model: Any) -> None:
    prompt = [5, 17, 33, 8, 61, 2, 40] * 12
    # A clock that makes every pass cost the same whatever its width (as where decode is bound
    # by memory bandwidth): drafting then pays wherever drafts are accepted, so the width the
    # batch chooses does not depend on how busy this machine is.
    ticks = itertools.count()
    batch = Batch(
        model, stop_tokens=(), width=4, prefill_chunk=128, speculate=True,
        _clock=lambda: next(ticks) * 0.01,
    )  # fmt: skip
    batch.insert(prompt, max_tokens=120, cache=fresh_cache(model), held=[], drafter=PromptLookup())
    steps = produced = 0
    while produced < 120:
        produced += sum(len(e.tokens) for e in batch.step(128)[1])
        steps += 1
    accepted = batch.counters.accepted_tokens
    assert accepted > 10
    assert steps <= 120 - accepted + 2  # the prompt's step, and the last pass's


def test_stop_tokens_and_max_tokens_cut_an_accepted_run(model: Any) -> None:
    prompts = repetitive_prompts(3, count=4)
    plain, _ = generate(model, prompts, 70, speculate=False)
    # Stop on a token each output has after a few tokens: the run containing it is cut there.
    stops = {out[len(out) // 3] for out in plain}
    for speculate in (False, True):
        batch = Batch(
            model, stop_tokens=sorted(stops), width=8, prefill_chunk=16, speculate=speculate
        )
        uids = [
            batch.insert(p, max_tokens=70, cache=fresh_cache(model), held=[],
                         drafter=PromptLookup() if speculate else None)
            for p in prompts
        ]  # fmt: skip
        outputs: dict[int, list[int]] = {uid: [] for uid in uids}
        finished: dict[int, Any] = {}
        while len(finished) < len(uids):
            for event in batch.step(16)[1]:
                outputs[event.uid] += event.tokens
                if event.finish_reason:
                    finished[event.uid] = event
        for uid, prompt, out in zip(uids, prompts, plain, strict=True):
            cut = next(i for i, t in enumerate(out) if t in stops) + 1
            assert outputs[uid] == out[:cut] and finished[uid].finish_reason == "stop"
            held_caches, held_tokens = finished[uid].held
            # What a finished sequence leaves: its KV holds exactly the tokens it reports.
            assert held_tokens == prompt + outputs[uid][:-1]
            assert held_caches[0].offset == len(held_tokens)


def test_a_removed_row_leaves_the_others_exact(model: Any) -> None:
    prompts = repetitive_prompts(8, count=4)
    plain, _ = generate(model, prompts, 50, speculate=False)
    batch = Batch(model, stop_tokens=(), width=8, prefill_chunk=16, speculate=True)
    uids = [
        batch.insert(p, max_tokens=50, cache=fresh_cache(model), held=[], drafter=PromptLookup())
        for p in prompts
    ]
    outputs: dict[int, list[int]] = {uid: [] for uid in uids}
    removed: dict[int, Any] = {}
    while any(len(outputs[u]) < 50 for u in uids if u not in removed):
        for event in batch.step(16)[1]:
            outputs[event.uid] += event.tokens
        if not removed and len(outputs[uids[1]]) >= 10:  # mid-run, a pass in flight
            removed = batch.remove([uids[1]])
            caches, tokens = removed[uids[1]]
            assert caches[0].offset == len(tokens)
            assert tokens[len(prompts[1]) :] == outputs[uids[1]][: len(tokens) - len(prompts[1])]
    for i, uid in enumerate(uids):
        if uid in removed:
            assert outputs[uid] == plain[i][: len(outputs[uid])]
        else:
            assert outputs[uid] == plain[i]


# --- the KV rollback itself --------------------------------------------------------------


def test_a_rolled_back_row_attends_as_if_the_rejected_tokens_were_never_written(
    model: Any,
) -> None:
    """Two rows, written with different run lengths and rolled back by different counts:
    the next pass gives each row the logits a fresh cache of exactly its tokens gives."""
    rng = random.Random(2)
    rows = [[rng.randrange(96) for _ in range(n)] for n in (7, 12)]
    singles = []
    for tokens in rows:
        cache = fresh_cache(model)
        model(mx.array([tokens]), cache=cache)
        singles.append(cache)
    caches = [RowKVCache.of_sequences([a, b]) for a, b in zip(*singles, strict=True)]
    drafts = [[rng.randrange(96) for _ in range(4)] for _ in rows]
    model(mx.array(drafts), cache=caches)  # 4 positions each...
    keep = [1, 3]  # ...of which row 0 keeps 1 and row 1 keeps 3
    for cache in caches:
        cache.rollback([4 - k for k in keep])
    assert not caches[0].aligned
    probe = [[3, 9], [14, 1]]
    batched = model(mx.array(probe), cache=caches)
    for r, tokens in enumerate(rows):
        cache = fresh_cache(model)
        expected = model(mx.array([tokens + drafts[r][: keep[r]] + probe[r]]), cache=cache)
        assert mx.allclose(batched[r], expected[0, -2:], atol=1e-4).item(), r
        assert caches[0].length(r) == len(tokens) + keep[r] + 2


def test_rows_of_different_ends_join_and_leave(model: Any) -> None:
    """extend and filter keep each row's end: a row added or kept reads the same logits."""
    rng = random.Random(4)
    seqs = [[rng.randrange(96) for _ in range(n)] for n in (5, 9, 3)]

    def row_caches(tokens: list[int]) -> list[Any]:
        cache = fresh_cache(model)
        model(mx.array([tokens]), cache=cache)
        return [RowKVCache.of_sequences([c]) for c in cache]

    first = row_caches(seqs[0])
    for mine, theirs in zip(first, row_caches(seqs[1]), strict=True):
        mine.extend(theirs)
    model(mx.array([[7, 7], [8, 8]]), cache=first)  # then rows that end apart
    for cache in first:
        cache.rollback([2, 1])
    others = row_caches(seqs[2])
    for mine, theirs in zip(first, others, strict=True):
        mine.extend(theirs)
        mine.filter([2, 1])  # keep the newcomer and row 1
    out = model(mx.array([[11], [12]]), cache=first)
    for r, tokens in enumerate([seqs[2] + [11], seqs[1] + [8, 12]]):
        expected = model(mx.array([tokens]), cache=fresh_cache(model))
        assert mx.allclose(out[r, -1], expected[0, -1], atol=1e-4).item(), r


# --- sampling: the same distribution -----------------------------------------------------


def exact_distribution(model: Any, prompt: list[int], length: int) -> dict[tuple[int, ...], float]:
    """The probability of every continuation of `length` tokens (sampling at temperature 1)."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], p: float) -> None:
        if len(prefix) == length:
            out[tuple(prefix)] = p
            return
        logits = model(mx.array([prompt + prefix]))[0, -1]
        probs = mx.softmax(logits.astype(mx.float32)).tolist()
        for token, q in enumerate(probs):
            if p * q > 1e-7:
                walk([*prefix, token], p * q)

    walk([], 1.0)
    return out


@pytest.mark.slow  # 2,400 sampled generations: ~15 s
def test_sampled_speculation_keeps_the_models_distribution() -> None:
    """A small vocabulary, sampling at temperature 1: the joint distribution of the first
    three tokens, from many speculative generations, against the exact one (chi-square)."""
    model = random_qwen3(vocab=6, hidden=16, layers=1, seed=3, scale=0.6)
    prompt = [1, 2, 3, 4] * 6  # drafts proposed at every step
    exact = exact_distribution(model, prompt, 3)
    sampler = _temperature_one()
    mx.random.seed(7)
    n = 2400
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for _ in range(n // 8):
        outputs, counters = generate(model, [prompt] * 8, 3, speculate=True, sampler=sampler)
        counts.update(tuple(out[:3]) for out in outputs)
        drafted += counters.drafted_tokens
        accepted += counters.accepted_tokens
    assert drafted > n and 0 < accepted < drafted  # drafts were verified, both ways
    statistic, cells = _chi_square(counts, exact, n)
    # 0.1% critical value of chi-square with `cells - 1` degrees of freedom (Wilson–Hilferty).
    dof = cells - 1
    z = 3.09
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert statistic < critical, (statistic, critical, dof)


def _temperature_one() -> Any:
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(temp=1.0)


def _chi_square(
    counts: Counter[tuple[int, ...]], exact: dict[tuple[int, ...], float], n: int
) -> tuple[float, int]:
    """Pearson's statistic over cells expected at least 5 times (the rest pooled)."""
    statistic, cells = 0.0, 0
    pooled_seen, pooled_expected = 0, 0.0
    for outcome, p in exact.items():
        expected = p * n
        if expected >= 5:
            statistic += (counts[outcome] - expected) ** 2 / expected
            cells += 1
        else:
            pooled_seen += counts[outcome]
            pooled_expected += expected
    pooled_seen += sum(c for o, c in counts.items() if o not in exact)
    if pooled_expected >= 5:
        statistic += (pooled_seen - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return statistic, cells


# --- logits processors under rollback ----------------------------------------------------


def test_a_repetition_penalty_gives_the_plain_output_with_drafts(model: Any) -> None:
    asked = Sampling(temperature=0.0, repetition_penalty=1.3)
    sampling = resolve_sampling(asked, SamplingDefaults())
    prompts = repetitive_prompts(21, count=3)
    make = lambda _: penalty_processors(sampling)  # noqa: E731
    assert all(isinstance(p, Stateless) for p in make(0))
    plain, _ = generate(model, prompts, 50, speculate=False, processors=make)
    speculative, counters = generate(model, prompts, 50, speculate=True, processors=make)
    assert speculative == plain and counters.drafted_tokens > 0


def test_a_thinking_budget_gives_the_plain_output_with_drafts(model: Any) -> None:
    """The budget counts drafted tokens, then takes the rejected ones back: it forces its end
    marker exactly where it would without drafts."""
    prompts = repetitive_prompts(31, count=3)
    plain_out, _ = generate(model, prompts, 50, speculate=False)
    start = plain_out[0][1]  # tokens the outputs contain, as markers
    make = lambda _: [ThinkingBudget(6, [start], [95, 94], inside=True)]  # noqa: E731
    plain, _ = generate(model, prompts, 50, speculate=False, processors=make)
    speculative, counters = generate(model, prompts, 50, speculate=True, processors=make)
    assert speculative == plain and counters.drafted_tokens > 0
    assert any(95 in out for out in plain)  # the budget did cut a span


def test_a_thinking_budget_rolled_back_is_the_budget_never_shown_those_tokens() -> None:
    rng = random.Random(1)
    for _ in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randint(0, 30))]
        back = rng.randint(0, min(len(tokens), 8))
        prompt = [0, 0]
        shown = ThinkingBudget(4, [1], [2, 3], inside=rng.random() < 0.5)
        fresh = ThinkingBudget(4, [1], [2, 3], inside=shown.inside)
        logits = mx.zeros((1, 6))
        for n in range(len(tokens) + 1):
            shown(mx.array(prompt + tokens[:n]), logits)
        shown.rollback(back)
        for n in range(len(tokens) - back + 1):
            fresh(mx.array(prompt + tokens[:n]), logits)
        state = lambda b: (b.inside, b.spent, b.cut, b._tail, b._forcing, b._seen)  # noqa: E731
        assert state(shown) == state(fresh), (tokens, back)


def test_a_sequence_whose_processor_cannot_roll_back_never_drafts(model: Any) -> None:
    class Counting:  # stateful, no rollback
        def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
            return logits

    prompts = repetitive_prompts(2, count=2)
    _, counters = generate(model, prompts, 30, speculate=True, processors=lambda _: [Counting()])
    assert counters.drafted_tokens == 0


# --- the drafter and the width -----------------------------------------------------------


def test_prompt_lookup_proposes_what_followed_the_latest_match() -> None:
    def naive(seq: list[int], k: int) -> list[int]:
        for n in range(4, 1, -1):
            if len(seq) <= n:
                continue
            for i in range(len(seq) - n - 1, -1, -1):
                if seq[i : i + n] == seq[-n:]:
                    return seq[i + n : i + n + k]
        return []

    rng = random.Random(0)
    for _ in range(500):
        seq = [rng.randrange(4) for _ in range(rng.randint(0, 50))]
        cut = rng.randint(0, len(seq))
        lookup = PromptLookup(seq[:cut])  # built at once, then grown
        lookup.extend(seq[cut:])
        assert lookup.propose(5) == naive(seq, 5), seq


def test_no_drafts_where_nothing_is_likely_accepted() -> None:
    width = DraftWidth()
    for _ in range(9):  # measured: a wide pass costs three plain steps here
        width.observe(1, 0.010)
        width.observe(5, 0.030)
    poor = Acceptance()
    for _ in range(10):
        poor.observe(4, 0)
    good = Acceptance()
    for _ in range(10):
        good.observe(4, 4)
    assert width.choose([4, 4], [poor, poor]) == 0
    assert width.choose([4], [good]) >= 2
    assert width.choose([0, 0], [good, good]) == 0  # nothing proposed
    for _ in range(40):  # a sequence given up on is tried again after a while
        poor.idle()
    assert poor.rate > 0.45


def test_a_width_tried_unmeasured_is_held_long_enough_to_be_measured() -> None:
    """A step's time is known only after two passes of one width in a row, so a width chosen
    while unmeasured is kept for PROBE_STEPS steps; then the measured cost decides."""
    from mlxlaunch.engine.decoding.drafting import PROBE_STEPS

    width = DraftWidth()
    for _ in range(9):
        width.observe(1, 0.010)
    good = Acceptance()
    for _ in range(10):
        good.observe(4, 4)
    first = width.choose([4], [good])
    assert first > 0  # unmeasured widths are assumed cheap, so one is tried
    held = [width.choose([4], [good]) for _ in range(PROBE_STEPS - 1)]
    assert held == [first] * (PROBE_STEPS - 1)
    for _ in range(9):  # measured: every drafted token costs a whole plain step
        for w in range(2, 10):
            width.observe(w, 0.010 * w)
    assert width.choose([4], [good]) == 0  # linear cost: drafting cannot pay


def test_a_speculative_sequences_kept_kv_continues_as_a_fresh_prefill_would(model: Any) -> None:
    """What a finished sequence leaves (its KV, written with drafts and rolled back, and the
    tokens it holds) continues a next turn exactly as prefilling those tokens afresh does."""
    prompt = repetitive_prompts(41, count=1)[0]
    batch = Batch(model, stop_tokens=(), width=2, prefill_chunk=16, speculate=True)
    batch.insert(prompt, max_tokens=60, cache=fresh_cache(model), held=[], drafter=PromptLookup())
    finished = None
    while finished is None:
        finished = next((e for e in batch.step(16)[1] if e.finish_reason), None)
    assert batch.counters.accepted_tokens > 0 and finished.held is not None
    caches, tokens = finished.held
    suffix = [7, 7, 3, 19]
    outputs = []
    for cache, held in ((caches, tokens), (fresh_cache(model), [])):
        turn = Batch(model, stop_tokens=(), width=2, prefill_chunk=16, speculate=False)
        whole = [*tokens, finished.tokens[-1], *suffix]
        turn.insert(whole[len(held) :], max_tokens=30, cache=cache, held=held)
        out: list[int] = []
        while len(out) < 30:
            out += [t for e in turn.step(16)[1] for t in e.tokens]
        outputs.append(out)
    assert outputs[0] == outputs[1]


def test_a_lone_decoding_row_keeps_the_cpu_attentions_plain_masks(model: Any) -> None:
    """A single unpadded row attends causally: its boolean mask becomes None (one query) or
    "causal" (a verify pass), so the CPU attention and MLX's causal kernel take it, as they
    take mlx-lm's own batch cache; rows that end apart keep their mask."""
    from mlxlaunch.engine.runtime.cpu_attention import plain_mask

    cache = fresh_cache(model)
    model(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    row = RowKVCache.of_sequences([cache[0]])
    for n, plain in ((1, None), (3, "causal")):
        queries = mx.zeros((1, 4, n, 8))
        keys = mx.zeros((1, 2, 5 + n, 8))
        assert plain_mask(queries, keys, row.make_mask(n), row) == plain
    two = RowKVCache.of_sequences([cache[0], fresh_cache(model)[0]])
    mask = two.make_mask(1)
    assert plain_mask(mx.zeros((2, 4, 1, 8)), mx.zeros((2, 2, 6, 8)), mask, two) is mask
