"""The haiku-tier workload: Claude Code's main turn while its side requests run beside it.

Claude Code sends its background work (session titles, summaries, subagents) under the haiku
tier's model id while the user waits for the main loop. This workload times what the user waits
for, on three servers started for it alone, alternating:

- ours with `--small-model S`: the tier's requests go to S, the main turn to the main model;
- ours with the main model only (as without `--small-model`): every request on one model;
- mlx_lm.server on the main model (peers map every tier to one model).

Each round, on each server: a main turn alone (a new tool result on a cached session, as
Claude Code sends after a tool round trip), a side request alone, then the next main turn while
`side_streams` side requests run back to back beside it. The rows give the main turn's time to
first token alone and beside the side streams, and the side requests' latency alone and while
the main turn ran, for ours with the small model next to the peer; ours on one model is in
each row's note, and every figure is in the JSON report.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxlaunch.bench.clients import AnthropicTarget, Target
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.ours import OURS_NAME, LocalServer, start_local_server
from mlxlaunch.bench.peer import PEER_NAME, PeerServer, ready_target
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.prompt import AgentPrompt
from mlxlaunch.bench.rows import SummaryRow, median_of
from mlxlaunch.bench.runner import alternate
from mlxlaunch.bench.workloads import Conversation, agent_session, short_chat
from mlxlaunch.engine.types import ChatMessage
from mlxlaunch.errors import MlxLaunchError

WORKLOAD = "haiku-tier"
# The id Claude Code's background tier sends by default (ANTHROPIC_DEFAULT_HAIKU_MODEL).
SIDE_MODEL_ID = "claude-haiku-4-5-20251001"
# Our two servers' names in the report.
ONE_MODEL = f"{OURS_NAME} (one model)"
# Claude Code's title request, in short: what the side streams send.
_TITLE_SYSTEM = (
    "You name coding sessions. Reply with a title of two to five words for the session "
    "below, a noun phrase in sentence case, nothing else."
)


def with_small_model(small_name: str) -> str:
    """Our server with the small model, as the report names it."""
    return f"{OURS_NAME} --small-model {small_name}"


@dataclass(frozen=True)
class TierPlan:
    """The requests of the workload: the session's first turn (the warm-up caches it), two main
    turns per round (alone, then beside the side streams) and the side streams' sizes."""

    warmup: Conversation
    main_turns: list[Conversation]
    side_streams: int
    side_tokens: int
    main_tokens: int

    @property
    def rounds(self) -> int:
        return len(self.main_turns) // 2


def tier_plan(prompt: AgentPrompt, config: BenchConfig) -> TierPlan:
    """The workload for `config`: a session of `1 + 2 * haiku_rounds` turns of its own."""
    turns = agent_session(
        prompt,
        turns=1 + 2 * config.haiku_rounds,
        tool_result_chars=config.tool_result_chars,
        session=WORKLOAD,
    )
    return TierPlan(
        warmup=turns[0],
        main_turns=turns[1:],
        side_streams=config.haiku_side_streams,
        side_tokens=config.haiku_side_tokens,
        main_tokens=config.turn_max_tokens,
    )


def side_request(index: int) -> Conversation:
    """Side request `index`: a session title under the haiku tier's id, unique per index."""
    session = f"<session>\nsession {index}: the cache keys ignore file edits\n</session>"
    return Conversation(
        system=_TITLE_SYSTEM,
        tools=(),
        messages=[ChatMessage(role="user", content=session)],
        model=SIDE_MODEL_ID,
    )


@dataclass
class SideStreams:
    """`count` side streams sending side requests back to back until `stop()`; each request's
    start and timing is kept."""

    target: Target
    count: int
    tokens: int
    ids: Iterator[int]
    clock: Callable[[], float]
    done: list[dict[str, Any]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _first: list[asyncio.Event] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._first = [asyncio.Event() for _ in range(self.count)]
        self._tasks = [asyncio.create_task(self._run(e)) for e in self._first]

    async def steady(self) -> None:
        """Until every stream has finished a request: all of them are running by then."""
        await asyncio.gather(*(e.wait() for e in self._first))

    async def stop(self) -> None:
        """Let each stream finish the request it is in, then end them."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _run(self, first: asyncio.Event) -> None:
        while not self._stop.is_set():
            started = self.clock()
            timing = await self.target.measure(side_request(next(self.ids)), self.tokens)
            self.done.append({"start_s": started, **timing.as_dict()})
            first.set()
            if timing.error:  # a server that refuses them would spin: one error is enough
                break
        first.set()

    def overlapping(self, start: float, end: float) -> list[dict[str, Any]]:
        """The requests that ran, at least in part, between `start` and `end`."""
        return [d for d in self.done if d["start_s"] < end and d["start_s"] + d["total_s"] > start]


async def measure_round(
    target: Target, plan: TierPlan, number: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, Any]:
    """Round `number` (from 1) on `target`: a main turn alone, a side request alone, the next
    main turn beside the side streams."""
    alone_turn, beside_turn = plan.main_turns[2 * number - 2 : 2 * number]
    ids = itertools.count(number * 1000)
    alone = await target.measure(alone_turn, plan.main_tokens)
    side_alone = await target.measure(side_request(next(ids)), plan.side_tokens)
    streams = SideStreams(target, plan.side_streams, plan.side_tokens, ids, clock)
    streams.start()
    try:
        await streams.steady()
        start = clock()
        beside = await target.measure(beside_turn, plan.main_tokens)
        end = clock()
    finally:
        await streams.stop()
    return {
        "main_alone": alone.as_dict(),
        "side_alone": side_alone.as_dict(),
        "main_beside": beside.as_dict(),
        "side_beside": streams.overlapping(start, end),
    }


async def measure_tier(
    targets: list[Target], plan: TierPlan, progress: ProgressSink
) -> dict[str, Any]:
    """The warm-up and every round on every target, alternating; raw figures per round."""

    async def warm(target: Target) -> dict[str, Any]:
        # Kernels compiled, the session's prefix and a side request's cached: the rounds time
        # what is new in each turn, as in a running session.
        await target.measure(short_chat(0), 2)
        session = await target.measure(plan.warmup, plan.main_tokens)
        await target.measure(side_request(0), plan.side_tokens)
        progress.advance()
        return session.as_dict()

    warmup = await alternate(targets, 0, warm)
    rounds = []
    for number in range(1, plan.rounds + 1):

        async def run(target: Target, n: int = number) -> dict[str, Any]:
            figures = await measure_round(target, plan, n)
            progress.advance()
            return figures

        rounds.append({"round": number, "results": await alternate(targets, number, run)})
    return {"targets": [t.name for t in targets], "warmup": warmup, "rounds": rounds}


def tier_steps(plan: TierPlan, targets: int) -> int:
    """Progress steps of the measuring: the warm-up and every round, per server."""
    return targets * (1 + plan.rounds)


async def run_haiku_tier(
    plan: TierPlan,
    *,
    model_dir: str,
    small_model_dir: str,
    small_name: str,
    progress: ProgressSink,
    peer: bool = True,
    peer_timeout_s: float = 300.0,
    engine_options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Start the workload's servers (ours with and without the small model, the peer unless
    `peer` is False), measure, stop them. Raw figures and warnings (a server that does not
    start is left out with the reason, not fatal)."""
    warnings: list[str] = []
    targets: list[Target] = []
    ours: dict[str, LocalServer] = {}
    other: PeerServer | None = None
    with tempfile.TemporaryDirectory(prefix="mlx-bench-haiku-tier-") as tmp:
        progress.begin(f"haiku tier: starting the servers (small model {small_name})", 1)
        try:
            if peer:
                other = PeerServer(model_dir)
                other.start()  # loads in its own process while ours load here
            settings = ((with_small_model(small_name), small_model_dir), (ONE_MODEL, None))
            for name, small in settings:
                try:
                    local = await start_local_server(
                        model_dir,
                        small_model=small,
                        cache_dir=Path(tmp) / name.replace(" ", "_"),
                        **(engine_options or {}),
                    )
                except MlxLaunchError as exc:
                    warnings.append(f"{name} left out of the haiku tier: {exc.message}")
                    continue
                ours[name] = local
                targets.append(AnthropicTarget(name, local.url, auth_token=local.auth_token))
            if other is not None:
                ready = await ready_target(other, peer_timeout_s, warnings, "haiku tier")
                targets += [ready] if ready else []
            progress.advance()
            progress.begin("haiku tier, alternating", tier_steps(plan, len(targets)))
            figures = await measure_tier(targets, plan, progress)
            figures["served_by"] = {name: _served_by(local) for name, local in ours.items()}
        finally:
            for target in targets:
                await target.aclose()
            for local in ours.values():
                local.stop()
            if other is not None:
                other.stop()
    figures |= {
        "small_model": small_name,
        "side_model_id": SIDE_MODEL_ID,
        "side_streams": plan.side_streams,
    }
    return figures, warnings


def _served_by(local: LocalServer) -> dict[str, int]:
    """Requests each of our server's models completed, by role ("main", "small"): where the
    side requests went."""
    stats = local.engine.stats()
    return {m.role: m.counters.requests_completed for m in stats.models or (stats,)}


# --- its rows in the report ---------------------------------------------------------------


def haiku_tier_rows(servers: dict[str, Any]) -> list[SummaryRow]:
    """The haiku tier's rows: ours with the small model beside the peer, ours on one model in
    each row's note (none when the workload did not run)."""
    tier = servers.get("haiku_tier")
    if not tier or not tier.get("rounds"):
        return []
    names: list[str] = tier["targets"]
    small = with_small_model(tier["small_model"])
    metrics: tuple[tuple[str, Callable[[dict[str, Any]], list[Any]]], ...] = (
        ("main TTFT alone p50", lambda r: [r["main_alone"].get("ttft_s")]),
        (
            f"main TTFT, {tier['side_streams']} side streams p50",
            lambda r: [r["main_beside"].get("ttft_s")],
        ),
        ("side request alone p50", lambda r: [r["side_alone"].get("total_s")]),
        ("side request beside main p50", lambda r: [s.get("total_s") for s in r["side_beside"]]),
    )
    rows = []
    for metric, pick in metrics:
        values = {n: median_of(x for r in tier["rounds"] for x in pick(r["results"][n]))
                  for n in names}  # fmt: skip
        shown = {OURS_NAME: values.get(small)} | {n: values[n] for n in names if n == PEER_NAME}
        note = f"--small-model {tier['small_model']}"
        if values.get(ONE_MODEL) is not None:
            note += f"; one model: {values[ONE_MODEL]:.2f} s"
        rows.append(SummaryRow(WORKLOAD, metric, "s", False, shown, notes={OURS_NAME: note}))
    return rows
