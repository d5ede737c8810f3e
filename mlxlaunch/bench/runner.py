"""Runs the workloads: in-process limits first, then both servers, alternating request by request.

Alternating (ours, peer, then peer, ours, ...) spreads background noise over both servers evenly.
Each server keeps its own caches, so interleaving does not disturb what either can reuse. Each
concurrency level runs in rounds, the server that goes first alternating, so a stalled round
shows as one bad round instead of a lower average.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from mlxlaunch.bench.clients import StreamTiming, Target
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.inprocess import InProcessModel
from mlxlaunch.bench.plan import BenchPlan
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.stats import decode_rate, intervals, summarize, throughput
from mlxlaunch.bench.workloads import Conversation, short_chat

T = TypeVar("T")


class Named(Protocol):
    """Anything measured in turn with others: it has a name."""

    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


def limit_steps(config: BenchConfig) -> int:
    """Steps of the in-process phase."""
    return 1 + config.turns + config.warm_sessions + int(config.restart) + config.decode_runs


def server_steps(config: BenchConfig, targets: int) -> int:
    """Steps of the server phase for `targets` servers."""
    per_target = 2 + config.turns + config.warm_sessions + config.decode_runs
    return targets * (per_target + len(config.concurrency) * config.concurrency_rounds)


def measure_limits(
    model: InProcessModel, plan: BenchPlan, config: BenchConfig, progress: ProgressSink
) -> dict[str, Any]:
    """The prefill floor of every turn and the decode ceiling, in this process."""
    floors = model.prefill_floor(plan.floor_prompts(), on_done=progress.advance)
    ceiling = []
    for _ in range(config.decode_runs):
        sample = model.decode_ceiling(plan.decode, config.decode_tokens)
        ceiling.append(
            {
                "prompt_tokens": sample.prompt_tokens,
                "output_tokens": len(sample.token_times),
                "token_times_s": sample.token_times,
                "tokens_per_s": throughput(
                    len(sample.token_times), sample.token_times[-1] if sample.token_times else None
                ),
                "decode_tokens_per_s": decode_rate(sample.token_times, len(sample.token_times)),
            }
        )
        progress.advance()
    return {
        "prefill_floor": [
            {
                "label": f.label,
                "prompt_tokens": f.prompt_tokens,
                "reused_tokens": f.reused_tokens,
                "new_tokens": f.new_tokens,
                "seconds": f.seconds,
            }
            for f in floors
        ],
        "decode_ceiling": ceiling,
    }


def order_of(targets: Sequence[N], step: int) -> list[N]:
    """The order targets run in at `step`: rotated by one each step (two targets alternate)."""
    shift = step % len(targets) if targets else 0
    return [*targets[shift:], *targets[:shift]]


async def alternate(
    targets: Sequence[N], step: int, run: Callable[[N], Awaitable[T]]
) -> dict[str, T]:
    """Run `run` on every target, one after another, in an order that changes every step."""
    results: dict[str, T] = {}
    for target in order_of(targets, step):
        results[target.name] = await run(target)
    return {t.name: results[t.name] for t in targets}


async def measure_streams(
    target: Target, prompts: Sequence[Conversation], max_tokens: int, clock: Callable[[], float]
) -> dict[str, Any]:
    """Streams started together on one server, one per prompt; their timings and the wall
    time of them all (from sending the first to the end of the last)."""
    start = clock()
    timings = await asyncio.gather(*(target.measure(p, max_tokens) for p in prompts))
    wall = clock() - start
    return {"wall_s": wall, "streams": [t.as_dict() for t in timings]}


def timed_figures(timing: StreamTiming) -> dict[str, Any]:
    """A timed request's raw figures with its rates: overall, decode, gaps between tokens."""
    data = timing.as_dict()
    data["tokens_per_s"] = throughput(timing.output_tokens, timing.total_s)
    data["decode_tokens_per_s"] = decode_rate(timing.token_times, timing.output_tokens or 0)
    data["inter_token_s"] = summarize(intervals(timing.token_times))
    return data


async def measure_servers(
    targets: Sequence[Target],
    plan: BenchPlan,
    config: BenchConfig,
    progress: ProgressSink,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Every server workload on every target, alternating; raw figures keyed by target name."""
    step = 0

    async def each(conversation_run: Callable[[Target], Awaitable[T]]) -> dict[str, T]:
        nonlocal step
        results = await alternate(targets, step, conversation_run)
        step += 1
        for _ in targets:
            progress.advance()
        return results

    def one(conversation: Any, max_tokens: int) -> Callable[[Target], Awaitable[dict[str, Any]]]:
        async def run(target: Target) -> dict[str, Any]:
            return timed_figures(await target.measure(conversation, max_tokens))

        return run

    # A short unrelated request first: kernel compilation and first-call costs stay out of the
    # cold figure, and it shares no prefix with the Claude Code prompt.
    warmup = await each(one(short_chat(0), 2))
    cold = await each(one(plan.cold, config.turn_max_tokens))
    turns = []
    for number, conversation in enumerate(plan.turns, start=1):
        results = await each(one(conversation, config.turn_max_tokens))
        turns.append({"turn": number, "results": results})
    warm = [await each(one(c, config.turn_max_tokens)) for c in plan.warm]
    decode = [await each(one(plan.decode, config.decode_tokens)) for _ in range(config.decode_runs)]
    concurrency = []
    for streams in config.concurrency:
        prompts = plan.streams.get(streams) or [short_chat(i + 1) for i in range(streams)]

        def run(target: Target, p: list[Conversation] = prompts) -> Awaitable[dict[str, Any]]:
            return measure_streams(target, p, config.concurrency_tokens, clock)

        rounds = []
        for number in range(1, config.concurrency_rounds + 1):
            first = order_of(targets, step)[0].name
            rounds.append({"round": number, "first": first, "results": await each(run)})
        # `results`: the first round, the shape of reports from before rounds.
        concurrency.append({"streams": streams, "results": rounds[0]["results"], "rounds": rounds})
    names = [t.name for t in targets]
    return {
        "targets": names,
        "warmup": warmup,
        "new_session": {"cold": cold, "warm": warm},
        "agent_session": turns,
        "decode": decode,
        "concurrency": concurrency,
    }
