"""`mlx bench`: how fast this machine serves a model, next to mlx-lm's own server.

The benchmark's own modules (and mlx-lm behind them) are imported when the command runs:
every other `mlx` command, `mlx --help` included, must not pay for them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mlxlaunch.cli.consoles import stdout_console
from mlxlaunch.cli.options import model_option
from mlxlaunch.errors import ConfigError
from mlxlaunch.home import mlxlaunch_home

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn, TaskID

    from mlxlaunch.bench.config import BenchConfig
    from mlxlaunch.cluster.hosts import Cluster
    from mlxlaunch.launch.transcripts import Transcript


class ProgressBars:
    """A rich progress bar per phase of the run (a ProgressSink)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None

    def begin(self, description: str, steps: int) -> None:
        """Fill the previous phase's bar and start a new one."""
        if self._task is not None:
            self._progress.update(self._task, completed=self._progress.tasks[-1].total)
        self._task = self._progress.add_task(description, total=steps)

    def advance(self) -> None:
        """One step of the current phase done."""
        if self._task is not None:
            self._progress.advance(self._task)


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--concurrency takes numbers like 1,2,4,8, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise ConfigError("--concurrency levels must be positive")
    return levels


def _kv_bits(text: str) -> tuple[int, ...]:
    from mlxlaunch.engine.settings import KV_BITS

    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in {str(b) for b in KV_BITS} for w in words):
        allowed = " or ".join(map(str, KV_BITS))
        raise ConfigError(f"--replay-kv-bits takes {allowed}, comma-separated, not {text!r}")
    return tuple(int(w) for w in words)


def _modes(text: str) -> tuple[str, ...]:
    from mlxlaunch.engine.config import SPECULATE_MODES

    modes = [m for m in SPECULATE_MODES if m != "draft"]  # the bench names no draft model
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in modes for w in words):
        allowed = ", ".join(modes)
        raise ConfigError(f"--replay-speculate takes {allowed}, comma-separated, not {text!r}")
    return tuple(words)


def bench(
    model: Annotated[
        str, model_option("Alias, org/repo, path, or a test model (tiny, small, medium, large).")
    ],
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Short prompt, few turns: a smoke run in under a minute."),
    ] = False,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Benchmark our server already running here (same --model)."),
    ] = None,
    auth_token: Annotated[
        str | None,
        typer.Option("--auth-token", envvar="MLX_BENCH_AUTH_TOKEN", help="Bearer token for --url."),
    ] = None,
    peer: Annotated[
        bool, typer.Option("--peer/--no-peer", help="Also run mlx-lm's own server (mlx_lm.server).")
    ] = True,
    turns: Annotated[int | None, typer.Option(help="Agent-session turns.")] = None,
    tool_result_chars: Annotated[
        int | None, typer.Option(help="Characters of each tool result.")
    ] = None,
    decode_tokens: Annotated[int | None, typer.Option(help="Tokens per decode run.")] = None,
    runs: Annotated[int | None, typer.Option(help="Decode runs per server.")] = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Simultaneous streams to try, e.g. 1,2,4,8.")
    ] = None,
    concurrency_prompt_tokens: Annotated[
        int | None, typer.Option(min=1, help="Prompt tokens of each concurrent stream (about).")
    ] = None,
    concurrency_tokens: Annotated[
        int | None, typer.Option(min=1, help="Tokens each concurrent stream generates.")
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(min=1, help="Rounds of each concurrency level and speculative workload."),
    ] = None,
    speculative: Annotated[
        bool,
        typer.Option(
            "--speculative/--no-speculative",
            help="Compare --speculate auto with off on a copy workload and a no-copy one.",
        ),
    ] = True,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart/--no-restart",
            help="Restart each server as a new process and time a new session's first turn.",
        ),
    ] = True,
    tool_loop: Annotated[
        bool,
        typer.Option(
            "--tool-loop/--no-tool-loop",
            help="Time new prompts after tool loops, on a test model with Qwen3's real template.",
        ),
    ] = True,
    codex_session: Annotated[
        bool,
        typer.Option(
            "--codex-session/--no-codex-session",
            help="Replay Codex CLI's captured session over /v1/responses, beside Claude Code's.",
        ),
    ] = True,
    small_model: Annotated[
        str | None,
        typer.Option(
            "--small-model",
            help="Also time the main turn beside Claude Code's side requests (haiku tier): ours "
            "with this small model beside the main one, with the main one only, and mlx-lm's "
            "server.",
            show_default=False,
        ),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Our server's batch width (default: the engine's)."),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            help="Replay your own recorded session on both servers, request by request: a "
            "Claude Code transcript (~/.claude/projects/<project>/<session>.jsonl) or a Codex "
            "rollout (~/.codex/sessions/<date>/rollout-*.jsonl).",
            show_default=False,
        ),
    ] = None,
    replay_kv_bits: Annotated[
        str | None,
        typer.Option(
            "--replay-kv-bits",
            help="With --replay: replay again on our server with each --kv-bits, e.g. 8,4.",
            show_default=False,
        ),
    ] = None,
    replay_speculate: Annotated[
        str | None,
        typer.Option(
            "--replay-speculate",
            help="With --replay: replay again on our server with each --speculate mode, "
            "e.g. off,lookup.",
            show_default=False,
        ),
    ] = None,
    redact: Annotated[
        bool,
        typer.Option(
            "--redact",
            help="With --replay: replace every text of the session with filler of the same "
            "token count, and replay that (shareable); see --redact-out.",
        ),
    ] = False,
    redact_out: Annotated[
        Path | None,
        typer.Option(
            "--redact-out",
            help="Where --redact writes the redacted session, in the agent's own format "
            "(default: beside the report, <name>.redacted.jsonl).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory for the JSON report and the SVG chart (default: mlxlaunch's "
            "home, bench/; never the current directory, which may be your project).",
            show_default=False,
        ),
    ] = None,
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts",
            help="Measure `mlx serve --hosts` on these machines (rank 0 first: this one) beside "
            "one process, e.g. 127.0.0.1,10.0.0.2.",
            show_default=False,
        ),
    ] = None,
    hostfile: Annotated[
        Path | None,
        typer.Option("--hostfile", help="An MLX hostfile instead of --hosts.", show_default=False),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="With --hosts: ring or jaccl (default: the hostfile's, else ring).",
            show_default=False,
        ),
    ] = None,
    parallel: Annotated[
        str,
        typer.Option("--parallel", help="With --hosts: auto, tensor or pipeline."),
    ] = "auto",
    ranks: Annotated[
        str | None,
        typer.Option(
            "--ranks",
            help="With --hosts: the rank counts to measure, e.g. 1,2,3 (k ranks run on the "
            "first k hosts; default: 1 and every host).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Measure time to first token over a Claude Code session, decode speed and concurrency.

    Every workload runs on this project's server and on mlx-lm's `mlx_lm.server` with the same
    model and prompts, alternating; the table shows both and their ratio, next to the
    in-process limits (prefill floor, decode ceiling). Each concurrency level runs --rounds
    times, so a stalled round shows. Codex CLI's captured session follows on the same servers
    over /v1/responses (a server without that API is reported as such). Then each server is
    restarted as a new process (ours on the same prefix-cache directory) and a new session's
    first turn is timed. Last, speculative decoding: ours with --speculate auto beside off on
    a copy workload (a test model rewriting a file) and on this model's decode prompt, with
    `mlx_lm.server --draft-model` on the copy workload, in a table of its own. With
    --small-model, the haiku tier: the main turn alone and beside four side requests (session
    titles under the haiku tier's id), on ours with the small model, ours without it and
    mlx-lm's server.

    Examples:

      mlx bench --quick --model tiny

      mlx bench --model qwen-coder-7b --turns 8

      mlx bench --model qwen-coder-30b --small-model qwen3-0.6b

      mlx bench --model ./my-model --url http://127.0.0.1:8080 --no-peer

      mlx bench --quick --model tiny-moe --hosts 127.0.0.1,127.0.0.1

      mlx bench --quick --model tiny --replay ~/.claude/projects/-app/ID.jsonl

    With --hosts (or --hostfile) the workloads run once per rank count instead, each alone:
    `mlx serve` as one process, then `mlx serve --hosts` on the first k hosts; the table shows
    every rank count and its ratio to the first. mlx-lm's server, the tool loop and
    speculative decoding are left out.

    With --replay, one of your own sessions follows on the same servers: each request its
    agent sent (not the model's new answers), with time to first token, prompt tokens reused
    and where a turn missed our prefix cache and why, the answer's tool-call validity, and
    decode speed per turn. --redact replaces its text with filler of the same token count
    first, so the replay (and --redact-out's file) can be shared.
    --replay-kv-bits and --replay-speculate replay it again on a server of ours with each
    setting, alone on the machine, to pick them.
    """
    from mlxlaunch.cluster.hosts import cluster_from_options

    cluster = cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel)
    if cluster is not None and url:
        raise ConfigError("--url measures one server already running; --hosts starts its own")
    if cluster is None and ranks is not None:
        raise ConfigError("--ranks needs --hosts or --hostfile")
    if cluster is not None and small_model:
        raise ConfigError("--small-model is measured on one machine; --hosts serves one model")
    if cluster is not None and replay is not None:
        raise ConfigError("--replay measures one server beside mlx_lm.server, not --hosts")
    if replay is None and (redact or redact_out is not None):
        raise ConfigError("--redact and --redact-out need --replay PATH")
    if replay is None and (replay_kv_bits or replay_speculate):
        raise ConfigError("--replay-kv-bits and --replay-speculate need --replay PATH")
    from mlxlaunch.bench.config import BenchConfig
    from mlxlaunch.bench.report import caveats, markdown_table, render_table

    config = BenchConfig.create(
        quick=quick,
        turns=turns,
        tool_result_chars=tool_result_chars,
        decode_tokens=decode_tokens,
        decode_runs=runs,
        concurrency=_levels(concurrency) if concurrency else None,
        concurrency_prompt_tokens=concurrency_prompt_tokens,
        concurrency_tokens=concurrency_tokens,
        concurrency_rounds=rounds,
        speculative_rounds=rounds,
        haiku_rounds=rounds,
        speculative=speculative,
        restart=restart,
        tool_loop=tool_loop,
        codex_session=codex_session,
        replay_kv_bits=_kv_bits(replay_kv_bits) if replay_kv_bits else None,
        replay_speculate=_modes(replay_speculate) if replay_speculate else None,
    )
    console = stdout_console()  # logs and CI: the table is not wrapped at 80 columns
    import asyncio

    from mlxlaunch.bench.harness import BenchOptions, run_benchmark
    from mlxlaunch.launch.models import resolve_name

    out = out if out is not None else bench_dir()
    model_dir = resolve_name(model)
    if cluster is not None:
        _bench_cluster(cluster, ranks, str(model_dir), model, config, max_concurrency, out, console)
        return
    recorded = None
    if replay is not None:
        recorded = _recorded_session(replay, redact or redact_out is not None, redact_out,
                                     str(model_dir), out, console)  # fmt: skip
    options = BenchOptions(
        str(model_dir),
        model,
        config,
        url=url,
        auth_token=auth_token,
        peer=peer,
        max_concurrency=max_concurrency,
        small_model_dir=str(resolve_name(small_model)) if small_model else None,
        small_model_name=small_model,
        replay=recorded,
    )
    with _progress(console) as progress:
        outcome = asyncio.run(run_benchmark(options, ProgressBars(progress)))
    for warning in outcome.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    report = outcome.report
    console.print(render_table(outcome.rows, outcome.ours, outcome.peer, _title(report, model)))
    for caveat in caveats(outcome.rows, outcome.ours, outcome.peer, quick=quick):
        console.print(f"[yellow]note:[/] {caveat}", highlight=False)
    table = markdown_table(report, outcome.rows)
    if outcome.speculative:
        table += "\n" + _print_speculative(outcome, config.speculative_rounds, console)
    _write(out, report, table, outcome, model, console)


def _recorded_session(
    path: Path, redact: bool, redact_out: Path | None, model_dir: str, out: Path, console: Console
) -> Transcript:
    """The session --replay names, redacted first when asked (then the redacted copy is what
    replays); says what the transcript does not record and where that was taken from."""
    from mlxlaunch.launch.transcripts import read_transcript

    transcript = read_transcript(path)
    if redact:
        from mlxlaunch.bench.replay import model_token_count, write_redacted

        target = redact_out if redact_out is not None else out / f"{path.stem}.redacted.jsonl"
        transcript, inexact = write_redacted(transcript, model_token_count(model_dir), target)
        console.print(f"redacted session: {target}", highlight=False)
        if inexact:
            console.print(
                f"[yellow]note:[/] {inexact} texts got filler a few tokens shorter than they were "
                "(no filler of exactly their count)",
                highlight=False,
            )
    console.print(
        f"replaying {len(transcript.turns)} turns of {transcript.agent} session "
        f"{transcript.session_id} (recorded by version {transcript.version or 'unknown'}); "
        f"not in the transcript, taken from {transcript.template}'s captured request: "
        f"{', '.join(transcript.filled)}",
        highlight=False,
    )
    return transcript


def _print_speculative(outcome: Any, rounds: int, console: Console) -> str:
    """Print the speculative-decoding table and its notes; return it in Markdown."""
    from mlxlaunch.bench import speculative_report as spec

    figures = outcome.report["workloads"]["speculative"]
    title = "speculative decoding: --speculate auto beside off (and mlx_lm.server's draft model)"
    rows = outcome.speculative
    console.print(spec.render_speculative_table(rows, figures["base"], rounds, title))
    for note in spec.speculative_notes(figures):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    return spec.speculative_markdown(figures, rows, rounds)


def bench_dir() -> Path:
    """Where `mlx bench` writes its reports unless told: the mlxlaunch home's `bench/`."""
    return mlxlaunch_home() / "bench"


def _progress(console: Console) -> Progress:
    """The run's progress bars: a phase, its bar, steps done, time so far."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns: tuple[ProgressColumn, ...] = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=True)


def _title(report: dict[str, Any], model: str) -> str:
    machine = report["machine"]
    return (
        f"mlx bench · {report['date']} · model {model} · {machine['device']} · "
        f"{machine['blas']} · {machine['cpu_count']} CPUs"
        + (" · quick" if report["config"]["quick"] else "")
    )


def _write(
    out: Path, report: dict[str, Any], table: str, outcome: Any, model: str, console: Console
) -> None:
    """The JSON report, the Markdown table and the per-turn TTFT chart, under `out`."""
    from mlxlaunch.bench.chart import turn_ttft_svg
    from mlxlaunch.bench.report import write_json

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = write_json(report, out / f"bench-{stamp}.json")
    chart_path = out / f"bench-{stamp}-ttft.svg"
    chart_path.write_text(turn_ttft_svg(outcome.servers, outcome.limits, model=model))
    table_path = out / f"bench-{stamp}.md"
    table_path.write_text(table, encoding="utf-8")
    console.print(f"JSON: {json_path}\nchart: {chart_path}\ntable: {table_path}", highlight=False)


def _bench_cluster(
    cluster: Cluster,
    ranks: str | None,
    model_dir: str,
    model: str,
    config: BenchConfig,
    max_concurrency: int | None,
    out: Path,
    console: Console,
) -> None:
    """`mlx bench --hosts`: every rank count in turn, then the table of them side by side."""
    import asyncio

    from mlxlaunch.bench.cluster_bench import ClusterBenchOptions, run_cluster_benchmark
    from mlxlaunch.bench.rank_report import rank_markdown, render_rank_table
    from mlxlaunch.bench.ranks import parse_ranks
    from mlxlaunch.bench.report import caveats

    options = ClusterBenchOptions(
        model_dir,
        model,
        cluster,
        parse_ranks(ranks, cluster),
        config,
        max_concurrency=max_concurrency,
    )
    with _progress(console) as progress:
        outcome = asyncio.run(run_cluster_benchmark(options, ProgressBars(progress)))
    for warning in outcome.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    report = outcome.report
    title = _title(report, model) + f" · {cluster.backend} over {', '.join(cluster.hosts)}"
    console.print(render_rank_table(outcome.rows, outcome.names, title))
    for caveat in [*outcome.notes, *caveats(outcome.rows, outcome.base, None, quick=config.quick)]:
        console.print(f"[yellow]note:[/] {caveat}", highlight=False)
    _write(out, report, rank_markdown(report, outcome.rows), outcome, model, console)
