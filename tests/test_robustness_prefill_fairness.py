"""Fairness under a long prefill (issue 19, item 11): running streams slow by at most ~2x.

A near-limit prompt used to prefill in fixed 512-token chunks, one per step between the decode
steps of the running streams; a chunk deep in a long prompt costs ~100x a decode step, so the
streams crawled (issue 19: four streams from 1.5 s to 27.7 s). Each step now prefills only what
a share of a decode step's time buys (`scheduling/prefill_pacing.py`).

Measured on this machine (2 cores shared with other jobs, reference BLAS, so +-50% run to run),
medium test model, a 10.5k-token prompt while four streams decode. Before: the streams' mean
token gap went from 1.4-3.9 ms to 120-376 ms (84-97x); the prompt's first token came after
1.0-1.9x its time alone. After: 1.6-2.1x (longest gap 55-70 ms in quiet runs: one slice), and
the prompt's first token after 2.2-5x its time alone (the streams keep about half the machine).

The pacer is tested on its own against a simulated cost model (fast, exact), the whole engine
on a real model (slow: a ratio of measured times, which holds on a busy machine too).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_helpers import forced_streams, timed_prompt, wait_until

from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.prefill_pacing import MIN_SLICE_S, PREFILL_SHARE, PrefillPacer
from mlxlaunch.testing.scripted import ScriptedOutput

# --- the pacer against a simulated machine ------------------------------------------------


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Machine:
    """Step costs shaped like the CPU's: a decode step, and a prefill pass with a fixed cost
    plus a per-token cost that grows with the position (attention reads every earlier token)."""

    decode_s: float = 0.0015
    pass_s: float = 0.004
    token_s: float = 0.0001
    per_position_s: float = 2e-8

    def prefill_s(self, tokens: int, position: int) -> float:
        if tokens == 0:
            return 0.0
        return self.pass_s + tokens * (self.token_s + self.per_position_s * position)


def simulate(
    pacer: PrefillPacer,
    clock: SimulatedClock,
    machine: Machine,
    prompt: int,
    *,
    decoding: bool = True,
) -> tuple[list[float], list[int]]:
    """Step a batch (a decoding stream if `decoding`, one prompt of `prompt` tokens) until the
    prompt is prefilled: each step's period and each step's slice."""
    done, periods, slices = 0, [], []
    while done < prompt:
        tokens = min(pacer.plan(decoding=decoding, prefilling=True), prompt - done)
        period = (machine.decode_s if decoding else 0.0) + machine.prefill_s(tokens, done)
        pacer.prefilled(tokens)
        done += tokens
        clock.now += period
        periods.append(period)
        slices.append(tokens)
    return periods, slices


def test_a_long_prefill_slows_a_decoding_stream_by_at_most_the_share() -> None:
    clock, machine = SimulatedClock(), Machine()
    pacer = PrefillPacer(512, clock=clock)
    periods, _ = simulate(pacer, clock, machine, 40_000)
    mean_period = sum(periods) / len(periods)
    assert mean_period <= (1 + PREFILL_SHARE) * machine.decode_s * 1.05, mean_period
    # No step stalls the stream for long: at most one sized slice, deep in the prompt too.
    worst = max(periods) - machine.decode_s
    assert worst <= 1.5 * MIN_SLICE_S, worst


def test_the_prefill_still_gets_its_share_of_the_machine() -> None:
    clock, machine = SimulatedClock(), Machine()
    pacer = PrefillPacer(512, clock=clock)
    periods, _ = simulate(pacer, clock, machine, 20_000)
    prefill_s = sum(periods) - len(periods) * machine.decode_s
    share = prefill_s / sum(periods)
    assert share >= 0.8 * PREFILL_SHARE / (1 + PREFILL_SHARE), share


def test_with_nobody_decoding_prompts_prefill_in_full_chunks() -> None:
    clock, machine = SimulatedClock(), Machine()
    pacer = PrefillPacer(512, clock=clock)
    _, slices = simulate(pacer, clock, machine, 4096, decoding=False)
    assert slices == [512] * 8


def test_slices_adapt_when_a_stream_starts_decoding_mid_prefill() -> None:
    clock, machine = SimulatedClock(), Machine()
    pacer = PrefillPacer(512, clock=clock)
    simulate(pacer, clock, machine, 10_000, decoding=False)  # learnt a token's cost alone
    pacer.pause()
    periods, slices = simulate(pacer, clock, machine, 10_000)
    assert slices[0] == 0  # first a decode step alone, to learn what it costs
    assert max(periods) - machine.decode_s <= 1.5 * MIN_SLICE_S


def test_a_preempted_step_is_repaid_not_repeated() -> None:
    clock, machine = SimulatedClock(), Machine()
    pacer = PrefillPacer(512, clock=clock)
    simulate(pacer, clock, machine, 2000)
    tokens = pacer.plan(decoding=True, prefilling=True)
    while tokens == 0:
        clock.now += machine.decode_s
        tokens = pacer.plan(decoding=True, prefilling=True)
    pacer.prefilled(tokens)
    clock.now += 0.5  # the machine was busy elsewhere for half a second
    following = [pacer.plan(decoding=True, prefilling=True) for _ in range(20)]
    assert following == [0] * 20  # the streams get their steps back first


# --- the engine on a real model -------------------------------------------------------------

pytest_slow = pytest.mark.slow  # the tests below load a model

STREAMS = 2
# ~6.3k tokens through the test tokenizer: seconds of prefill for the medium model.
LONG_PROMPT_REPEATS = 900
# Paced: 1.6-2.1x on a quiet machine; 2.8x seen once with other jobs on both cores. Unpaced
# (the bug) it was 84-97x, so this bound still fails it by a wide margin.
MAX_SLOWDOWN = 4.0


def mean_gap(times: list[float]) -> float:
    assert len(times) >= 10, len(times)
    return (times[-1] - times[0]) / (len(times) - 1)


@pytest_slow
async def test_a_long_prefill_slows_running_streams_by_at_most_about_2x(
    medium_engine: tuple[Engine, ScriptedOutput],
) -> None:
    engine_, scripted = medium_engine
    async with forced_streams(engine_, scripted, STREAMS) as arrivals:
        await wait_until(lambda: all(len(a) >= 20 for a in arrivals), timeout=30)
        alone_from = time.monotonic()
        await asyncio.sleep(1.0)
        alone = [t for t in arrivals[0] if t >= alone_from]
        # A fresh prompt: nothing of it may come from the prefix cache.
        long_text = f"{uuid.uuid4()} " + "many words in a very long prompt " * LONG_PROMPT_REPEATS
        admitted, admitted_at, first_token_at = await timed_prompt(engine_, long_text)
        assert admitted.prompt_tokens > 6000 and admitted.cached_tokens < 100, admitted
        after_from = time.monotonic()
        await asyncio.sleep(1.0)  # the streams alone again: the machine's load may have changed
        after = [t for t in arrivals[0] if t >= after_from]
        during = [t for t in arrivals[0] if admitted_at <= t <= first_token_at]

    alone_gap = (mean_gap(alone) + mean_gap(after)) / 2
    slowdown = mean_gap(during) / alone_gap
    assert slowdown <= MAX_SLOWDOWN, (slowdown, alone_gap, first_token_at - admitted_at)


@pytest_slow
def test_a_zero_slice_step_decodes_alone_and_a_slice_bounds_the_chunk(
    tiny_model_dir: Path,
) -> None:
    """What pacing relies on: a step's slice bounds how much of each prompt it prefills, and
    0 makes it a decode step alone."""
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from mlxlaunch.engine.scheduling.batch import Batch

    model = load(str(tiny_model_dir))[0]
    batch = Batch(model, stop_tokens=(), width=2, prefill_chunk=512)
    fresh = lambda: list(make_prompt_cache(model))  # noqa: E731
    batch.insert([5, 6, 7], max_tokens=100, cache=fresh(), held=[])
    for _ in range(5):  # until the short prompt decodes
        _, decoded = batch.step(512)
        if decoded:
            break
    assert decoded
    rng = random.Random(0)
    long_prompt = [rng.randrange(100, 1000) for _ in range(600)]
    batch.insert(long_prompt, max_tokens=2, cache=fresh(), held=[])
    prompts, decoded = batch.step(0)
    assert decoded and not prompts
    prompts, decoded = batch.step(24)
    assert decoded and [(p.done, p.ended) for p in prompts] == [(24, False)]
