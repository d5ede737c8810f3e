"""`mlx bench --hosts …`: the same workloads on one process and on several ranks, side by side.

Each rank count is measured on its own, one after the other: the ranks of a cluster may hold
most of every machine's memory, and a model worth splitting may not fit one machine beside
them, so no two servers run at once (unlike the peer comparison, which alternates). For every
rank count the server is `mlx serve` as a child process — plain for 1 rank, with `--hosts`
for more — on a fresh cache directory; then it is restarted on that directory for the restart
workload. The in-process limits are those of one process, measured first.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlxlaunch.bench.clients import AnthropicTarget
from mlxlaunch.bench.codex_session import (
    ResponsesTarget,
    codex_session_steps,
    measure_codex_session,
)
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.inprocess import InProcessModel
from mlxlaunch.bench.machine import describe_machine, describe_model
from mlxlaunch.bench.peer import PeerFailed
from mlxlaunch.bench.plan import BenchPlan, build_plan
from mlxlaunch.bench.progress import ProgressSink, SilentProgress
from mlxlaunch.bench.ranks import RankRun, overhead_note, rank_runs, sub_cluster
from mlxlaunch.bench.report import build_report
from mlxlaunch.bench.restart import ServeProcess, measure_restart
from mlxlaunch.bench.rows import SummaryRow
from mlxlaunch.bench.runner import (
    limit_steps,
    measure_limits,
    measure_servers,
    server_steps,
)
from mlxlaunch.bench.summary import summary_rows
from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.engine.config import default_prefill_chunk
from mlxlaunch.errors import ConfigError


@dataclass
class ClusterBenchOptions:
    """What a cluster benchmark measures.

    Args:
        model_dir: the model every rank count serves (and the in-process limits load).
        model_name: how the user named it.
        cluster: every host named; k ranks run on the first k.
        ranks: the rank counts to measure, ascending (1: the plain one-process serve).
        max_concurrency: every server's batch width (None: the engine's default).
        ready_timeout_s: how long a server may take to load before its rank count fails.
    """

    model_dir: str
    model_name: str
    cluster: Cluster
    ranks: tuple[int, ...]
    config: BenchConfig = field(default_factory=BenchConfig)
    max_concurrency: int | None = None
    ready_timeout_s: float = 300.0

    def serve_args(self) -> tuple[str, ...]:
        """Flags every rank count's `mlx serve` gets."""
        if self.max_concurrency is None:
            return ()
        return ("--max-concurrency", str(self.max_concurrency))


@dataclass
class ClusterOutcome:
    """The finished run: the JSON report, the table's rows and columns (rank counts, the
    first being the base of the ratios), notes on how to read them, and warnings."""

    report: dict[str, Any]
    rows: list[SummaryRow]
    servers: dict[str, Any]
    limits: dict[str, Any]
    names: list[str]
    notes: list[str]
    warnings: list[str]

    @property
    def base(self) -> str:
        return self.names[0]


def plan_rank_runs(options: ClusterBenchOptions) -> list[RankRun]:
    """Every rank count's server, after the checks `mlx serve --hosts` makes up front
    (reachability, versions, the model on every host, whether it splits), so a rank count
    that cannot run is refused before anything is measured.

    Raises:
        ConfigError: a rank count the model or the hosts cannot serve (the reasons listed).
    """
    from mlxlaunch.launch.cluster_commands import checked_parallel

    parallels = {}
    for count in options.ranks:
        if count > 1:
            try:
                parallels[count] = checked_parallel(
                    sub_cluster(options.cluster, count), options.model_dir
                )
            except ConfigError as exc:
                raise ConfigError(f"{count} ranks: {exc.message}", hint=exc.hint) from exc
    return rank_runs(options.cluster, options.ranks, parallels, options.serve_args())


def merge_figures(parts: Sequence[Any]) -> Any:
    """The raw figures of several runs of the same workloads, each on its own servers, as if
    measured together: results keyed by server name are united, lists of steps merged step by
    step, `targets` lists joined; anything else is the first run's (the same in every run)."""
    first = parts[0]
    if isinstance(first, dict):
        merged: dict[str, Any] = {}
        for part in parts:
            for key, value in part.items():
                if key == "targets":
                    merged[key] = [*merged.get(key, []), *value]
                elif key in merged:
                    merged[key] = merge_figures([merged[key], value])
                else:
                    merged[key] = value
        return merged
    if isinstance(first, list) and all(isinstance(p, list) and len(p) == len(first) for p in parts):
        return [merge_figures(list(steps)) for steps in zip(*parts, strict=True)]
    return first


@dataclass
class RankServer:
    """One rank count's server, started (maybe before the in-process limits, so its load
    overlaps theirs) and the bearer token it was started with."""

    run: RankRun
    process: ServeProcess
    token: str

    @classmethod
    def start(cls, run: RankRun, model_dir: str, cache_dir: Path) -> RankServer:
        token = secrets.token_hex(16)
        server = cls(run, run.server(model_dir, cache_dir=cache_dir, auth_token=token), token)
        server.process.start()
        return server

    async def wait_ready(self, timeout_s: float) -> None:
        """Until it serves.

        Raises:
            PeerFailed: it exited or timed out (the error names the rank count).
        """
        try:
            await asyncio.to_thread(self.process.wait_ready, timeout_s)
        except PeerFailed as exc:
            raise PeerFailed(f"{self.run.name}: {exc.message}", hint=exc.hint) from exc


async def _measure_rank_count(
    server: RankServer,
    options: ClusterBenchOptions,
    plan: BenchPlan,
    cache_dir: Path,
    progress: ProgressSink,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every workload on one rank count's started server, then its restart on the same cache
    directory. Returns the raw figures and the server's description."""
    config, run, token = options.config, server.run, server.token
    try:
        progress.begin(f"starting {run.name}", 1)
        await server.wait_ready(options.ready_timeout_s)
        progress.advance()
        url = server.process.url or ""
        target = AnthropicTarget(run.name, url, auth_token=token)
        progress.begin(f"{run.name}: workloads", server_steps(config, 1))
        try:
            figures = await measure_servers([target], plan, config, progress)
        finally:
            await target.aclose()
        if plan.codex:
            codex = ResponsesTarget(run.name, url, auth_token=token)
            progress.begin(f"{run.name}: Codex session", codex_session_steps(plan.codex, 1))
            try:
                figures["codex_session"] = await measure_codex_session(
                    [codex], plan.codex, progress=progress
                )
            finally:
                await codex.aclose()
    finally:
        # Stopped before the restart below; ours writes its pending prefixes as it stops.
        await asyncio.to_thread(server.process.stop)
    figures["restart"] = {}
    if plan.restart is not None:
        progress.begin(f"{run.name}: restart", 1)
        again = run.server(options.model_dir, cache_dir=cache_dir, auth_token=token)
        try:
            figures["restart"][run.name] = await measure_restart(
                again,
                lambda: AnthropicTarget(run.name, again.url or "", auth_token=token),
                plan.restart,
                max_tokens=config.turn_max_tokens,
                wait_s=config.restart_wait_s,
                ready_timeout_s=options.ready_timeout_s,
            )
        except PeerFailed as exc:
            raise PeerFailed(f"{run.name}, restarted: {exc.message}", hint=exc.hint) from exc
        progress.advance()
    return figures, {**run.describe(), "kind": "subprocess", "command": server.process.command()}


async def run_cluster_benchmark(
    options: ClusterBenchOptions, progress: ProgressSink | None = None
) -> ClusterOutcome:
    """The in-process limits, then every rank count's workloads, one count after another.

    Raises:
        ConfigError: a rank count the hosts or the model cannot serve (before anything runs).
        PeerFailed: a rank count's server did not come up (its log's end as the hint); every
            server started has been stopped.
    """
    progress = progress or SilentProgress()
    config = options.config
    runs = plan_rank_runs(options)
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    warnings: list[str] = []
    if config.tool_loop:
        warnings.append(
            "tool-loop left out: it serves a test model of its own in this process, not the "
            "model split across the ranks"
        )
    parts: list[dict[str, Any]] = []
    targets: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mlx-bench-cache-") as caches:

        def cache_of(run: RankRun) -> Path:
            return Path(caches) / f"ranks-{run.count}"

        # The first server loads while this process loads the model for the limits (as the
        # peer does in `mlx bench`); it is ready, and idle, before any limit is measured.
        server = RankServer.start(runs[0], options.model_dir, cache_of(runs[0]))
        try:
            progress.begin("loading the model in-process", 1)
            model = InProcessModel(options.model_dir, prefill_chunk=default_prefill_chunk())
            try:
                plan = build_plan(config, chars_per_token=model.chars_per_token())
                progress.advance()
                progress.begin(f"waiting for {runs[0].name}", 1)
                await server.wait_ready(options.ready_timeout_s)
                progress.advance()
                progress.begin("in-process prefill floor and decode ceiling", limit_steps(config))
                limits = measure_limits(model, plan, config, progress)
            finally:
                model.close()
            for index, run in enumerate(runs):
                if index:
                    server = RankServer.start(run, options.model_dir, cache_of(run))
                figures, targets[run.name] = await _measure_rank_count(
                    server, options, plan, cache_of(run), progress
                )
                parts.append(figures)
        finally:
            server.process.stop()  # idempotent: already stopped unless something failed
    servers = merge_figures(parts)
    rows = summary_rows(servers, limits)
    names = [run.name for run in runs]
    machine = describe_machine()
    notes = [
        note
        for run in runs
        if run.cluster is not None
        and (note := overhead_note(run.cluster, run.count, machine.get("cpu_count")))
    ]
    report = build_report(
        config={**config.as_dict(), "tool_loop": False},
        machine=machine,
        model=describe_model(options.model_dir, options.model_name),
        targets=targets,
        servers=servers,
        limits=limits,
        rows=rows,
        ours=names[0],
        peer=None,
        started=started_at,
        elapsed_s=time.perf_counter() - start,
    )
    report["ranks"] = {
        "counts": [run.count for run in runs],
        "names": names,
        "base": names[0],
        "hosts": list(options.cluster.hosts),
        "backend": options.cluster.backend,
        "local_only": options.cluster.local_only,
        "notes": notes,
    }
    report["summary"] = [rank_row(row, names) for row in rows]
    report["warnings"] = warnings
    return ClusterOutcome(report, rows, servers, limits, names, notes, warnings)


def rank_row(row: SummaryRow, names: Sequence[str]) -> dict[str, Any]:
    """A summary row for the JSON report, with each rank count's ratio to the first
    (>1: that many ranks did better)."""
    data = row.as_dict(names[0], "")
    del data["speedup"]
    data["ratios"] = {name: row.speedup(name, names[0]) for name in names[1:]}
    return data
