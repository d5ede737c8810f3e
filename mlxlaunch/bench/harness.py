"""One benchmark run from start to end: start the servers, measure, stop them, build the report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mlxlaunch.bench.clients import AnthropicTarget, OpenAITarget, Target
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.inprocess import InProcessModel
from mlxlaunch.bench.machine import describe_machine, describe_model
from mlxlaunch.bench.ours import OURS_NAME, LocalServer, start_local_server
from mlxlaunch.bench.peer import PEER_NAME, PeerFailed, PeerServer
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.report import build_report
from mlxlaunch.bench.runner import (
    ProgressSink,
    SilentProgress,
    limit_steps,
    measure_limits,
    measure_servers,
    server_steps,
)
from mlxlaunch.bench.summary import SummaryRow, summary_rows
from mlxlaunch.engine.config import default_prefill_chunk


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
    """

    model_dir: str
    model_name: str
    config: BenchConfig = field(default_factory=BenchConfig)
    url: str | None = None
    auth_token: str | None = None
    peer: bool = True
    peer_timeout_s: float = 300.0


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


async def run_benchmark(
    options: BenchOptions, progress: ProgressSink | None = None
) -> BenchOutcome:
    """Run every workload on our server and (unless disabled) mlx-lm's, alternating."""
    progress = progress or SilentProgress()
    config = options.config
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    plan = build_plan(config)
    warnings: list[str] = []
    peer = PeerServer(options.model_dir) if options.peer else None
    local: LocalServer | None = None
    targets: list[Target] = []
    target_info: dict[str, dict[str, Any]] = {}
    try:
        if peer:
            peer.start()  # loads in its own process while we load ours below
        progress.begin("loading the model in-process", 1)
        model = InProcessModel(options.model_dir, prefill_chunk=default_prefill_chunk())
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
            local = await start_local_server(options.model_dir)
            targets.append(AnthropicTarget(OURS_NAME, local.url, auth_token=local.auth_token))
            target_info[OURS_NAME] = local.describe()
            progress.advance()
        if peer:
            targets.append(OpenAITarget(PEER_NAME, peer.url))
            target_info[PEER_NAME] = {"kind": "subprocess", "url": peer.url,
                                      "command": peer.command()}  # fmt: skip
        progress.begin("servers, alternating", server_steps(config, len(targets)))
        servers = await measure_servers(targets, plan, config, progress)
    finally:
        for target in targets:
            await target.aclose()
        if local:
            local.stop()
        if peer:
            peer.stop()
    rows = summary_rows(servers, limits)
    peer_name = PEER_NAME if peer else None
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
    report["warnings"] = warnings
    return BenchOutcome(report, rows, servers, limits, OURS_NAME, peer_name, warnings)
