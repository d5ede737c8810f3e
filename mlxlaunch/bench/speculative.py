"""The speculative-decoding workload: our server with `--speculate auto` (and with a draft model)
beside `--speculate off`, in one run, on a workload whose replies copy their context and on one
whose replies do not; mlx_lm.server with a draft model beside them on the copy workload, where
it starts.

- copy: the `copy` test model (hand-wired: its greedy output walks a fixed chain of words,
  testing/copying.py) gets a file of that chain's text, a word changed every ~20, and "Rewrite
  it.". Its reply copies the file but for the edits, as an agent's Write of a file it just
  read copies a tool result: prompt-lookup drafts are accepted by the model's own forward
  passes, not by a script. Greedy, so every server writes the same reply.
- no-copy: the run's own model on the decode workload's prompt, sampled as that workload is
  (a test model's random output copies nothing): speculation should cost nothing there.

Each workload runs at each of `speculative_streams` streams at once, in rounds that rotate
which server goes first, after a warm-up that caches every prompt (so the rounds time decode).
Our servers' `/v1/stats` counters, read before and after each round, give the tokens drafted
and accepted in it; `speculative_report.py` turns the raw figures into the table.

mlx_lm.server runs the copy workload with `--draft-model copy-tiny` (the same chain in the tiny
shape, same tokenizer: its drafts are always right, a draft model's best case), started early
so it loads while the other workloads run. It turns batching off with a draft model, so its
streams run one after another. A server that does not start is reported with its reason, and
the rest of the workload goes on.

Our server also runs the copy workload with `--draft-model copy-tiny` (the same draft model as
the peer's), batching kept on.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from mlxlaunch.bench.clients import AnthropicTarget, OpenAITarget, Target
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.ours import OURS_NAME, LocalServer, start_local_server
from mlxlaunch.bench.peer import PEER_DRAFT_NAME, PeerFailed, PeerServer
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.runner import alternate, measure_streams, order_of
from mlxlaunch.bench.workloads import Conversation, file_rewrite, short_chat
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch.models import copy_model_text, resolve_name
from mlxlaunch.protocol.stats import StatsSnapshot

# The copy workload's model, and the draft model the peer drafts with.
COPY_MODEL = "copy"
COPY_DRAFT_MODEL = "copy-tiny"
# The counters of `/v1/stats` a round's figures come from.
COUNTERS = ("drafted_tokens", "accepted_tokens", "generated_tokens", "requests_completed")


@dataclass(frozen=True)
class SpecWorkload:
    """One workload of this phase: its model, its prompts per stream count, and the draft
    model that fits its model (None: no draft-model row)."""

    name: str
    model_dir: Path
    model: str  # the model as the report names it
    streams: dict[int, list[Conversation]]
    max_tokens: int
    draft_model: Path | None = None
    draft_name: str | None = None  # the draft model as the report names it
    description: str = ""


@dataclass(frozen=True)
class OursSetting:
    """One way our server runs in this phase: a row of the comparison."""

    flag: str  # how `mlx serve` spells it
    speculate: str  # EngineConfig.speculate
    draft: bool = False  # drafts with the workload's draft model (`--draft-model`)

    @property
    def name(self) -> str:
        return f"{OURS_NAME} {self.flag}"

    def engine_options(self, workload: SpecWorkload) -> dict[str, Any] | None:
        """EngineConfig arguments for this setting on `workload` (None: it has no draft model
        for a setting that needs one)."""
        if not self.draft:
            return {"speculate": self.speculate}
        if workload.draft_model is None:
            return None
        return {"speculate": self.speculate, "draft_model": str(workload.draft_model)}


PLAIN = OursSetting("--speculate off", "off")
# Every setting measured; each is compared with PLAIN, round by round.
SETTINGS = (
    OursSetting("--speculate auto", "auto"),
    OursSetting("--draft-model", "draft", draft=True),
    PLAIN,
)
BASE = PLAIN.name


def speculative_workloads(config: BenchConfig, model_dir: str, model: str) -> list[SpecWorkload]:
    """The copy workload (building its test models on first use) and the no-copy workload on
    `model_dir`, at `config.speculative_streams` streams."""
    copy_dir = resolve_name(COPY_MODEL)
    words, every = config.speculative_file_words, config.speculative_edit_every
    text = copy_model_text(copy_dir, words, edit_every=every)
    levels = config.speculative_streams
    copy = SpecWorkload(
        "copy",
        copy_dir,
        COPY_MODEL,
        {k: [file_rewrite(text, k, i) for i in range(1, k + 1)] for k in levels},
        config.speculative_tokens,
        draft_model=resolve_name(COPY_DRAFT_MODEL),
        draft_name=COPY_DRAFT_MODEL,
        description=f"rewrite a {words}-word file, a word changed every {every}; greedy",
    )
    no_copy = SpecWorkload(
        "no-copy",
        Path(model_dir),
        model,
        {k: [short_chat(i) for i in range(k)] for k in levels},
        config.decode_tokens,
        description="the decode prompt, sampled at the bench's temperature",
    )
    return [copy, no_copy]


class StatsProbe:
    """Reads our server's request counters from `GET /v1/stats` (the wire type dash reads)."""

    def __init__(self, base_url: str, auth_token: str | None) -> None:
        headers = {"authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._url = base_url.rstrip("/") + "/v1/stats"
        self._client = httpx.AsyncClient(headers=headers, timeout=30.0)

    async def counters(self) -> dict[str, int]:
        """The counters of COUNTERS, now."""
        response = await self._client.get(self._url)
        response.raise_for_status()
        counters = StatsSnapshot.model_validate_json(response.content).counters
        return {name: getattr(counters, name) for name in COUNTERS}

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()


class CounterSource(Protocol):
    """Where a server's request counters come from (`StatsProbe` for ours)."""

    async def counters(self) -> dict[str, int]: ...

    async def aclose(self) -> None: ...


@dataclass
class SpecServer:
    """A server of this phase: how to time requests on it, and its counters (ours only)."""

    target: Target
    stats: CounterSource | None = None

    @property
    def name(self) -> str:
        return self.target.name

    async def aclose(self) -> None:
        await self.target.aclose()
        if self.stats is not None:
            await self.stats.aclose()


async def measure_round(
    server: SpecServer,
    prompts: Sequence[Conversation],
    max_tokens: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """`prompts` at once on `server`: wall time and each stream's timing, and the change of
    the server's counters over the round (our servers; the peer has none)."""
    before = await server.stats.counters() if server.stats else None
    run = await measure_streams(server.target, prompts, max_tokens, clock)
    if server.stats is not None and before is not None:
        after = await server.stats.counters()
        run["counters"] = {name: after[name] - before[name] for name in COUNTERS}
    return run


def workload_steps(workload: SpecWorkload, rounds: int, servers: int) -> int:
    """Progress steps of one workload's measuring: the warm-up and every round, per server."""
    return servers * (1 + rounds * len(workload.streams))


async def measure_workload(
    servers: Sequence[SpecServer],
    workload: SpecWorkload,
    *,
    rounds: int,
    progress: ProgressSink,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The warm-up, then each stream count in `rounds` rounds on every server, rotating which
    goes first; raw figures per stream count and round, then per server."""
    by_name = {s.name: s for s in servers}
    warmup: dict[str, Any] = {}
    every_prompt = list({id(p): p for ps in workload.streams.values() for p in ps}.values())
    for server in servers:
        # Caches every prompt (and compiles kernels), so the rounds time decode, not prefill.
        warmup[server.name] = await measure_streams(server.target, every_prompt, 1, clock)
        progress.advance()
    levels = []
    step = 0
    for streams, prompts in workload.streams.items():
        measured = []
        for number in range(1, rounds + 1):

            async def run(target: Target, p: list[Conversation] = prompts) -> dict[str, Any]:
                figures = await measure_round(by_name[target.name], p, workload.max_tokens, clock)
                progress.advance()
                return figures

            targets = [s.target for s in servers]
            order = [t.name for t in order_of(targets, step)]
            results = await alternate(targets, step, run)
            measured.append({"round": number, "order": order, "results": results})
            step += 1
        levels.append({"streams": streams, "rounds": measured})
    return {"warmup": warmup, "levels": levels}


async def _start_ours(
    workload: SpecWorkload,
    cache_root: Path,
    engine_options: dict[str, Any],
    started: list[tuple[SpecServer, LocalServer]],
) -> dict[str, str]:
    """Our server in each setting that applies to `workload`, appended to `started` as it
    comes up (the caller stops them, whatever happens here); a setting whose server does not
    start is left out, and returned with the reason."""
    unavailable: dict[str, str] = {}
    for setting in SETTINGS:
        options = setting.engine_options(workload)
        if options is None:
            continue
        try:
            local = await start_local_server(
                str(workload.model_dir),
                cache_dir=cache_root / setting.speculate,
                **{**engine_options, **options},
            )
        except MlxLaunchError as exc:
            unavailable[setting.name] = exc.message
            continue
        target = AnthropicTarget(setting.name, local.url, auth_token=local.auth_token)
        started.append((SpecServer(target, StatsProbe(local.url, local.auth_token)), local))
    return unavailable


def start_draft_peers(workloads: Sequence[SpecWorkload]) -> dict[str, PeerServer]:
    """mlx_lm.server with its draft model for each workload that has one, by workload name.

    Returns at once: started early, a peer loads while other workloads run (it then waits
    idle) instead of while the machine waits for it.
    """
    peers = {}
    for workload in workloads:
        if workload.draft_model is not None:
            draft = ("--draft-model", str(workload.draft_model))
            peers[workload.name] = PeerServer(workload.model_dir, extra_args=draft)
            peers[workload.name].start()
    return peers


async def run_workload(
    workload: SpecWorkload,
    *,
    rounds: int,
    progress: ProgressSink,
    peer: PeerServer | None = None,
    peer_timeout_s: float = 300.0,
    engine_options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Start our servers for the workload, measure it beside `peer` (started, from
    `start_draft_peers`), stop them all. Raw figures (with the workload's description and the
    servers that did not start, with why) and warnings."""
    warnings: list[str] = []
    ours: list[tuple[SpecServer, LocalServer]] = []
    peer_client: SpecServer | None = None
    with tempfile.TemporaryDirectory(prefix="mlx-bench-speculative-") as tmp:
        progress.begin(f"speculative decoding, {workload.name}: starting the servers", 1)
        try:
            unavailable = await _start_ours(workload, Path(tmp), engine_options or {}, ours)
            servers = [server for server, _ in ours]
            if peer is not None:
                try:
                    await asyncio.to_thread(peer.wait_ready, peer_timeout_s)
                    peer_client = SpecServer(OpenAITarget(PEER_DRAFT_NAME, peer.url))
                    servers.append(peer_client)
                except PeerFailed as exc:
                    unavailable[PEER_DRAFT_NAME] = exc.message
            for name, reason in unavailable.items():
                warnings.append(f"{name} left out of the {workload.name} workload: {reason}")
            progress.advance()
            progress.begin(
                f"speculative decoding, {workload.name}, rotating",
                workload_steps(workload, rounds, len(servers)),
            )
            figures = await measure_workload(servers, workload, rounds=rounds, progress=progress)
        finally:
            for server, local in ours:
                await server.aclose()
                local.stop()
            if peer_client is not None:
                await peer_client.aclose()
            if peer is not None:
                peer.stop()
    figures |= {
        "workload": workload.name,
        "model": workload.model,
        "description": workload.description,
        "max_tokens": workload.max_tokens,
        "draft_model": workload.draft_name,
        "servers": [s.name for s in servers],
        "unavailable": unavailable,
        "prompt_tokens": _prompt_tokens(figures["warmup"]),
    }
    return figures, warnings


def _prompt_tokens(warmup: dict[str, Any]) -> int | None:
    """The prompt size of the workload's first stream, as the first server counted it."""
    for run in warmup.values():
        for stream in run["streams"]:
            if stream.get("prompt_tokens"):
                return int(stream["prompt_tokens"])
    return None


async def run_speculative(
    workloads: Sequence[SpecWorkload],
    *,
    rounds: int,
    progress: ProgressSink,
    peers: dict[str, PeerServer] | None = None,
    peer_timeout_s: float = 300.0,
    engine_options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Every workload in turn, each on servers of its own, beside its peer in `peers` (by
    workload name; each is stopped once its workload is done). Raw figures and warnings."""
    measured = []
    warnings: list[str] = []
    for workload in workloads:
        figures, more = await run_workload(
            workload,
            rounds=rounds,
            progress=progress,
            peer=(peers or {}).get(workload.name),
            peer_timeout_s=peer_timeout_s,
            engine_options=engine_options,
        )
        measured.append(figures)
        warnings += more
    return {"base": BASE, "settings": [s.name for s in SETTINGS], "workloads": measured}, warnings
