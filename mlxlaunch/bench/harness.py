"""One benchmark run from start to end: start the servers, measure, stop them, build the report."""

from __future__ import annotations

import secrets
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlxlaunch.bench.clients import AnthropicTarget, OpenAITarget, Target
from mlxlaunch.bench.codex_session import (
    ResponsesTarget,
    codex_session_steps,
    measure_codex_session,
)
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.haiku_tier import run_haiku_tier, tier_plan
from mlxlaunch.bench.inprocess import InProcessModel
from mlxlaunch.bench.machine import describe_machine, describe_model
from mlxlaunch.bench.ours import OURS_NAME, LocalServer, start_local_server
from mlxlaunch.bench.peer import PEER_NAME, PeerFailed, PeerServer
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.progress import ProgressSink, SilentProgress
from mlxlaunch.bench.replay import (
    ChatReplay,
    ReplayTarget,
    ServedReplay,
    describe,
    measure_replay,
    measure_settings,
    replay_settings,
    replay_turns,
)
from mlxlaunch.bench.report import build_report
from mlxlaunch.bench.restart import restart_both
from mlxlaunch.bench.rows import SummaryRow
from mlxlaunch.bench.runner import (
    limit_steps,
    measure_limits,
    measure_servers,
    server_steps,
)
from mlxlaunch.bench.speculative import (
    run_speculative,
    speculative_workloads,
    start_draft_peers,
)
from mlxlaunch.bench.speculative_report import SpecRow, speculative_rows
from mlxlaunch.bench.summary import summary_rows
from mlxlaunch.bench.tool_loop import run_tool_loop, tool_loop_size
from mlxlaunch.engine.config import default_prefill_chunk
from mlxlaunch.launch.transcripts import Transcript


@dataclass
class BenchOptions:
    """What to benchmark and against what.

    Args:
        model_dir: the model both servers and the in-process limits load.
        model_name: how the user named it (`tiny`, a hub id, a path).
        url: our server already running there (its model should be `model_dir`); None starts
            one in this process.
        auth_token: bearer token for `url`.
        peer: also run mlx-lm's own server.
        peer_timeout_s: how long the peer may take to load before it is left out.
        max_concurrency: our server's batch width (None: the engine's default).
        small_model_dir: a small model for the haiku-tier workload (`bench.haiku_tier`),
            served beside the main one as `--small-model` does (None: no such workload).
        small_model_name: how the user named it.
        replay: a recorded agent session to replay on both servers (`bench.replay`).
    """

    model_dir: str
    model_name: str
    config: BenchConfig = field(default_factory=BenchConfig)
    url: str | None = None
    auth_token: str | None = None
    peer: bool = True
    peer_timeout_s: float = 300.0
    max_concurrency: int | None = None
    small_model_dir: str | None = None
    small_model_name: str | None = None
    replay: Transcript | None = None

    def engine_options(self) -> dict[str, Any]:
        """EngineConfig arguments for our server beyond the model."""
        if self.max_concurrency is None:
            return {}
        return {"max_concurrency": self.max_concurrency}

    def serve_args(self) -> tuple[str, ...]:
        """The same settings as `mlx serve` flags (for the restarted server)."""
        if self.max_concurrency is None:
            return ()
        return ("--max-concurrency", str(self.max_concurrency))


@dataclass
class BenchOutcome:
    """The finished run: the JSON report and the rows the table shows."""

    report: dict[str, Any]
    rows: list[SummaryRow]
    servers: dict[str, Any]
    limits: dict[str, Any]
    ours: str
    peer: str | None
    warnings: list[str]
    speculative: list[SpecRow] = field(default_factory=list)  # its own table


def _codex_targets(
    options: BenchOptions, local: LocalServer | None, peer: PeerServer | None
) -> list[ResponsesTarget]:
    """The Codex session's clients: ours (at --url or started here) and the peer, if running."""
    if options.url:
        targets = [ResponsesTarget(OURS_NAME, options.url, auth_token=options.auth_token)]
    else:
        assert local is not None  # started before the server workloads
        targets = [ResponsesTarget(OURS_NAME, local.url, auth_token=local.auth_token)]
    if peer:
        targets.append(ResponsesTarget(PEER_NAME, peer.url))
    return targets


async def _stop(targets: list[Target], local: LocalServer | None, peer: PeerServer | None) -> None:
    """Close the clients and stop both servers (a stopped peer's `stop` is a no-op: it stays
    named, so later workloads start a peer of their own)."""
    for target in targets:
        await target.aclose()
    if local is not None:
        local.stop()
    if peer is not None:
        peer.stop()


def _replay_targets(
    options: BenchOptions, local: LocalServer | None, peer: PeerServer | None
) -> list[ReplayTarget]:
    """The replay's clients: ours over the agent's API, the peer over chat completions."""
    if options.url:
        targets: list[ReplayTarget] = [
            ServedReplay(OURS_NAME, options.url, auth_token=options.auth_token)
        ]
    else:
        assert local is not None  # started before the server workloads
        targets = [ServedReplay(OURS_NAME, local.url, auth_token=local.auth_token)]
    if peer:
        targets.append(ChatReplay(OpenAITarget(PEER_NAME, peer.url)))
    return targets


async def run_benchmark(
    options: BenchOptions, progress: ProgressSink | None = None
) -> BenchOutcome:
    """Run every workload on our server and (unless disabled) mlx-lm's, alternating; then
    speculative decoding and the tool loop, each on servers and models of its own."""
    progress = progress or SilentProgress()
    with tempfile.TemporaryDirectory(prefix="mlx-bench-cache-") as cache_dir:
        return await _run(options, progress, Path(cache_dir))


async def _run(options: BenchOptions, progress: ProgressSink, cache_dir: Path) -> BenchOutcome:
    """The run, with `cache_dir` as our server's prefix-cache directory (fresh and empty, so
    the cold figure is cold; the restarted server finds there what the first one saved)."""
    config = options.config
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    warnings: list[str] = []
    peer = PeerServer(options.model_dir) if options.peer else None
    local: LocalServer | None = None
    targets: list[Target] = []
    target_info: dict[str, dict[str, Any]] = {}
    restart: dict[str, Any] = {}
    spec_workloads = (
        speculative_workloads(config, options.model_dir, options.model_name)
        if config.speculative and not options.url
        else []
    )
    draft_peers: dict[str, PeerServer] = {}
    try:
        if peer:
            peer.start()  # loads in its own process while we load ours below
            draft_peers = start_draft_peers(spec_workloads)  # they wait idle until their turn
        progress.begin("loading the model in-process", 1)
        model = InProcessModel(options.model_dir, prefill_chunk=default_prefill_chunk())
        plan = build_plan(config, chars_per_token=model.chars_per_token())
        progress.advance()
        if peer:
            progress.begin(f"waiting for {PEER_NAME}", 1)
            try:
                peer.wait_ready(options.peer_timeout_s)
            except PeerFailed as exc:
                warnings.append(f"{PEER_NAME} left out: {exc.message}")
                peer.stop()
                peer = None
            progress.advance()
        progress.begin("in-process prefill floor and decode ceiling", limit_steps(config))
        try:
            limits = measure_limits(model, plan, config, progress)
        finally:
            model.close()
        if options.url:
            targets.append(AnthropicTarget(OURS_NAME, options.url, auth_token=options.auth_token))
            target_info[OURS_NAME] = {"kind": "url", "url": options.url}
        else:
            progress.begin(f"starting {OURS_NAME}", 1)
            local = await start_local_server(
                options.model_dir, cache_dir=cache_dir, **options.engine_options()
            )
            targets.append(AnthropicTarget(OURS_NAME, local.url, auth_token=local.auth_token))
            target_info[OURS_NAME] = local.describe()
            progress.advance()
        if peer:
            targets.append(OpenAITarget(PEER_NAME, peer.url))
            target_info[PEER_NAME] = {"kind": "subprocess", "url": peer.url,
                                      "command": peer.command()}  # fmt: skip
        progress.begin("servers, alternating", server_steps(config, len(targets)))
        servers = await measure_servers(targets, plan, config, progress)
        if plan.codex:
            # Same servers, same model, after the Claude Code workloads: its own prefix shares
            # nothing with theirs, so neither session's figures depend on the order.
            codex_targets = _codex_targets(options, local, peer)
            progress.begin(
                "Codex session over /v1/responses, alternating",
                codex_session_steps(plan.codex, len(codex_targets)),
            )
            try:
                servers["codex_session"] = await measure_codex_session(
                    codex_targets, plan.codex, progress=progress
                )
            finally:
                for codex_target in codex_targets:
                    await codex_target.aclose()
        if options.replay is not None:
            # Same servers and model again: the recorded session's prompt is its own.
            turns = replay_turns(options.replay, max_tokens=config.turn_max_tokens)
            replay_targets = _replay_targets(options, local, peer)
            progress.begin(
                f"replaying {options.replay.path.name}, alternating",
                len(turns) * len(replay_targets),
            )
            try:
                figures = await measure_replay(
                    replay_targets, turns, max_tokens=config.turn_max_tokens, progress=progress
                )
                servers["replay"] = {**describe(options.replay), **figures}
            finally:
                for replay_target in replay_targets:
                    await replay_target.aclose()
        if plan.restart is not None and (local or peer):
            # Stop both first: each restarted server is measured alone on the machine, and
            # ours writes its pending prefixes to the cache directory as it stops.
            ours_restarts = local is not None
            await _stop(targets, local, peer)
            targets, local = [], None
            progress.begin("restarting the servers", 1)
            restart, restart_warnings = await restart_both(
                model_dir=options.model_dir,
                cache_dir=cache_dir if ours_restarts else None,
                auth_token=secrets.token_hex(16),
                peer=peer is not None,
                conversation=plan.restart,
                max_tokens=config.turn_max_tokens,
                wait_s=config.restart_wait_s,
                ready_timeout_s=options.peer_timeout_s,
                serve_args=options.serve_args(),
            )
            warnings += restart_warnings
            progress.advance()
        servers["restart"] = restart
        if options.small_model_dir:
            # Its own servers (ours with and without the small model, the peer): alone.
            await _stop(targets, local, peer)
            targets, local = [], None
            if options.url:
                warnings.append(
                    "haiku tier left out: it compares servers started here with and without "
                    "--small-model, not the server at --url"
                )
            else:
                servers["haiku_tier"], tier_warnings = await run_haiku_tier(
                    tier_plan(plan.prompt, config),
                    model_dir=options.model_dir,
                    small_model_dir=options.small_model_dir,
                    small_name=options.small_model_name or options.small_model_dir,
                    progress=progress,
                    peer=peer is not None,
                    peer_timeout_s=options.peer_timeout_s,
                    engine_options=options.engine_options(),
                )
                warnings += tier_warnings
        if config.speculative or plan.tool_loop:
            # Their own models and servers, alone on the machine: stop these first.
            await _stop(targets, local, peer)
            targets, local = [], None
        if config.speculative and options.url:
            warnings.append(
                "speculative decoding left out: it compares servers started here with "
                "--speculate auto and off, not the server at --url"
            )
        elif spec_workloads:
            servers["speculative"], spec_warnings = await run_speculative(
                spec_workloads,
                rounds=config.speculative_rounds,
                progress=progress,
                peers=draft_peers,
                peer_timeout_s=options.peer_timeout_s,
                engine_options=options.engine_options(),
            )
            warnings += spec_warnings
        if plan.tool_loop:
            if options.url:
                warnings.append(
                    "tool-loop left out: it runs on a test model of its own, which the server "
                    "at --url does not serve"
                )
            else:
                servers["tool_loop"], loop_warnings = await run_tool_loop(
                    plan.tool_loop,
                    size=tool_loop_size(options.model_name, quick=config.quick),
                    max_tokens=config.turn_max_tokens,
                    progress=progress,
                    peer=peer is not None,
                    peer_timeout_s=options.peer_timeout_s,
                    engine_options=options.engine_options(),
                )
                warnings += loop_warnings
        settings = replay_settings(config.replay_kv_bits, config.replay_speculate)
        if options.replay is not None and settings:
            if options.url:
                warnings.append(
                    "replay settings left out: they start servers of their own, not the "
                    "server at --url"
                )
            else:
                for target in targets:  # each setting's server runs alone
                    await target.aclose()
                targets = []
                if local:
                    local.stop()
                    local = None
                if peer:
                    peer.stop()
                servers["replay"]["settings"] = await measure_settings(
                    options.model_dir,
                    replay_turns(options.replay, max_tokens=config.turn_max_tokens),
                    settings,
                    max_tokens=config.turn_max_tokens,
                    progress=progress,
                    engine_options=options.engine_options(),
                )
    finally:
        for target in targets:
            await target.aclose()
        if local:
            local.stop()
        if peer:
            peer.stop()
        for draft_peer in draft_peers.values():
            draft_peer.stop()
    rows = summary_rows(servers, limits)
    peer_name = PEER_NAME if options.peer and PEER_NAME in servers["targets"] else None
    report = build_report(
        config=config.as_dict(),
        machine=describe_machine(),
        model=describe_model(options.model_dir, options.model_name),
        targets=target_info,
        servers=servers,
        limits=limits,
        rows=rows,
        ours=OURS_NAME,
        peer=peer_name,
        started=started_at,
        elapsed_s=time.perf_counter() - start,
    )
    speculative = servers.get("speculative", {})
    spec_rows = speculative_rows(speculative) if speculative else []
    summary = [row.as_dict() for row in spec_rows]
    report["workloads"]["speculative"] = {**speculative, "summary": summary}
    report["warnings"] = warnings
    return BenchOutcome(
        report, rows, servers, limits, OURS_NAME, peer_name, warnings, speculative=spec_rows
    )
