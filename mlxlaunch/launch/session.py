"""`mlx launch <agent>`: engine + server in this process, the agent as a child, then clean up.

One lifetime for every entry of the integrations table (launch/integrations.py): claude, codex,
opencode. Order matters for the user: everything that can fail fast (the agent missing, model
unknown) fails before a model loads; the log path is printed before the terminal is handed
over; and whatever happens, the agent's per-launch directory goes, the state file goes, the
server drains and stops, and the engine closes (launch/serving.py, the lifetime `mlx serve`
shares). The agent's exit code is the launcher's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from mlxlaunch.config import UserConfig, load_config
from mlxlaunch.engine.config import LogitsHook
from mlxlaunch.errors import ModelNotFound
from mlxlaunch.home import mlxlaunch_home, private_dir
from mlxlaunch.launch.agent_bin import find_agent
from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget, agent_environment, write_setup
from mlxlaunch.launch.child import run_child
from mlxlaunch.launch.claude_bin import claude_version
from mlxlaunch.launch.claude_env import claude_model_id
from mlxlaunch.launch.cluster_serve import ClusterServed
from mlxlaunch.launch.integrations import CLAUDE, Integration
from mlxlaunch.launch.models import (
    ChosenModel,
    choose_model,
    demo_replies,
    is_test_model_name,
    notice_for_test_model,
    pullable,
)
from mlxlaunch.launch.options import LaunchOptions
from mlxlaunch.launch.resume import ResumeWarmth, warm_resumed_session
from mlxlaunch.launch.served import Served, served
from mlxlaunch.launch.server_log import logging_to, new_log_path, terminal_to_child
from mlxlaunch.launch.transcripts import TranscriptError
from mlxlaunch.runstate import pid_alive
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.search_backends import configured_backend


def launch_agent(
    agent: Integration,
    options: LaunchOptions,
    *,
    console: Console,
    environ: Mapping[str, str] | None = None,
    offer_pull: Callable[[str | None], bool] | None = None,
    logits_hook: LogitsHook | None = None,
    rank_command: tuple[str, ...] | None = None,
) -> int:
    """Run `agent` against a local model; returns the agent's exit code.

    `offer_pull(name)` is asked when the model named (by --model or the default-model
    setting) can be pulled but is not downloaded, or (name None) when none was named and none
    is downloaded; it returns True once it has pulled one. `logits_hook` scripts the model's
    output (tests; see launch/serving.py); `rank_command`, how a cluster's ranks start (tests
    script rank 0).
    """
    environ = dict(os.environ if environ is None else environ)
    binary = find_agent(agent, options.agent_bin)
    if options.verbose:
        console.print(f"{agent.name}: {binary} ({claude_version(binary) or 'version unknown'})")
    config = load_config(environ)
    options = with_settings(options, config)
    options.engine.config_arguments()  # before the model is built: a bad keep-alive fails fast
    if options.cluster is not None and options.model:  # this host may hold only its shard
        from mlxlaunch.launch.cluster_rank import rank_model_dir

        chosen = ChosenModel(options.model, rank_model_dir(options.model), "--model")
    else:
        chosen = _choose(options, config, offer_pull)
    log_file = new_log_path()
    token = secrets.token_urlsafe(32)
    settings = ServerSettings(
        host="127.0.0.1",
        port=options.port or 0,
        auth_token=token,
        model_id=claude_model_id(chosen.served_id),  # what claude is told to send
        search=configured_backend(config, environ),
    )
    max_output = options.max_output_tokens or _noise_cap(chosen)
    with logging_to(log_file), contextlib.ExitStack() as stack:
        serves: list[Served] = []  # said last, once every rank has stopped: why the agent
        stack.callback(_say_lost, console, serves, log_file)  # saw errors
        now = stack.enter_context(
            served(
                chosen,
                options.engine,
                settings,
                kind="launch",
                console=console,
                cluster=options.cluster,
                load="now" if options.preload else "background",
                log_file=log_file,
                log_level="info",
                # The demo's greeting names the agent it serves (serving's default names none).
                logits_hook=logits_hook or demo_replies(chosen.name, agent=agent.name),
                # Only an agent with a background tier has a use for a second model.
                small_model=options.small_model if agent.small_tier else None,
                max_output_tokens=max_output,
                rank_command=rank_command,
            )
        )
        serves.append(now)
        _announce(console, now, log_file, options, agent)
        _warm_resume(console, agent, options, environ, now.url, token)
        # The settings the state file holds, so --print-env elsewhere says the same.
        target = AgentTarget(now.url, token, now.client, cwd=Path.cwd())
        with agent_launch_dir(agent) as launch_dir:
            setup = agent.configure(target, launch_dir)
            prepare_launch_dir(setup, launch_dir)
            env = agent_environment(setup, environ, drops=agent.drops, extra=options.extra_env)
            argv = [str(binary), *setup.args, *options.agent_args]
            ended_by: list[int] = []
            with terminal_to_child(log_file) as stdio:
                code = run_child(argv, env, stdio=stdio, on_end_signal=ended_by.append)
            if signal.SIGTERM in ended_by:
                say_stopped(console, agent, code)
            return code


def _warm_resume(
    console: Console,
    agent: Integration,
    options: LaunchOptions,
    environ: Mapping[str, str],
    url: str,
    token: str,
) -> ResumeWarmth | None:
    """Prefill the session the agent's arguments resume, if this machine has its
    transcript, while the agent starts (launch/resume.py); say so, or why not."""
    try:
        warmth = warm_resumed_session(
            agent.name, options.agent_args, cwd=Path.cwd(), environ=environ, url=url, token=token
        )
    except TranscriptError as exc:
        console.print(f"[yellow]note:[/] not warming the resumed session: {exc.message}",
                      highlight=False)  # fmt: skip
        return None
    if warmth is not None:
        transcript = warmth.transcript
        console.print(
            f"[dim]resuming {transcript.session_id}: prefilling its {len(transcript.turns)} "
            f"turns while {agent.title} starts[/]",
            highlight=False,
        )
    return warmth


def _say_lost(console: Console, serves: list[Served], log_file: Path) -> None:
    for now in serves:
        if now.failure is not None:
            console.print(
                f"[bold red]mlx:[/] {now.failure}; every rank has stopped (server log: {log_file})",
                highlight=False,
            )


def say_stopped(console: Console, agent: Integration, code: int) -> None:
    """Why the agent's session ended: `mlx stop` (or any SIGTERM) stopped this launch."""
    with contextlib.suppress(OSError):  # the terminal may be gone as well
        console.print(
            f"[bold]mlx[/]: this launch was stopped (SIGTERM: `mlx stop`, or another process), "
            f"so {agent.title}'s session was ended; exit code {code}",
            highlight=False,
        )


def launch_dirs(agent: Integration, home: Path | None = None) -> Path:
    """Where the per-launch directories of `agent` live (`launch-<pid>` each)."""
    return (home or mlxlaunch_home()) / "agents" / agent.name


@contextlib.contextmanager
def agent_launch_dir(agent: Integration, home: Path | None = None) -> Iterator[Path]:
    """The path of this launch's private directory for `agent`, removed when the block ends.

    Under the mlxlaunch home, not /tmp (Codex refuses to put its helpers under a temporary
    directory). Left-overs of launches that were killed are removed first.
    """
    parent = launch_dirs(agent, home)
    for stale in parent.glob("launch-*") if parent.is_dir() else ():
        pid = stale.name.removeprefix("launch-")
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = parent / f"launch-{os.getpid()}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # links are removed, never followed


def prepare_launch_dir(setup: AgentSetup, launch_dir: Path) -> None:
    """Create `launch_dir` (0700) with the setup's files, if the setup has any."""
    if setup.files or setup.links or setup.kept_dirs:
        shutil.rmtree(launch_dir, ignore_errors=True)  # a reused pid's left-over
        write_setup(setup, private_dir(launch_dir))


def with_settings(options: LaunchOptions, config: UserConfig) -> LaunchOptions:
    """Fill options the user left out from their `mlx config` settings."""
    engine = options.engine
    return replace(
        options,
        small_model=options.small_model
        or config.get("default-small-model")
        or config.get("small-model"),
        port=options.port if options.port is not None else config.get("port"),
        engine=replace(
            engine,
            context_length=engine.context_length or config.get("context-length"),
            keep_alive=engine.keep_alive or config.get("keep-alive"),
        ),
    )


# Random-weight test models rarely emit an end token: without a cap each reply is noise up to
# the window-derived budget (minutes of it on a laptop CPU), which makes the demo feel hung.
TEST_MODEL_OUTPUT_CAP = 512


def _noise_cap(chosen: ChosenModel) -> int | None:
    """A short output budget for the offline test models (`demo`, `tiny`, …), else None."""
    return TEST_MODEL_OUTPUT_CAP if is_test_model_name(chosen.name) else None


def _choose(
    options: LaunchOptions, config: UserConfig, offer_pull: Callable[[str | None], bool] | None
) -> ChosenModel:
    """The model to serve; one that could be downloaded is offered for pulling (as `ollama
    run` does), then chosen again."""
    try:
        return choose_model(options.model, config)
    except ModelNotFound:
        named = options.model or config.default_model
        if offer_pull is None or (named is not None and not pullable(named)):
            raise
        if not offer_pull(named):
            raise
    return choose_model(options.model, config)


def _announce(
    console: Console,
    now: Served,
    log_file: Path,
    options: LaunchOptions,
    agent: Integration = CLAUDE,
) -> None:
    client = now.client
    console.print(
        f"[bold]mlx[/]: serving [cyan]{now.model.name}[/] as [cyan]{client.model_id}[/] "
        f"({client.context_window:,}-token window) at {now.url}",
        highlight=False,
    )
    if is_test_model_name(now.model.name):
        console.print(f"[yellow]note:[/] {notice_for_test_model(now.model.name)}", highlight=False)
    if isinstance(now, ClusterServed):
        hosts = ", ".join(now.ranks.cluster.hosts)
        console.print(
            f"[dim]{now.ranks.cluster.size} ranks ({now.ranks.spec.parallel} parallel): {hosts}[/]",
            highlight=False,
        )
    elif not options.preload:
        console.print("[dim]the model loads in the background while you type[/]")
    console.print(f"[dim]server log: {log_file}[/]", highlight=False)
    console.print("[dim]watch it live from another terminal: mlx dash[/]")
    if options.verbose:
        console.print(f"model: {now.model.path} (from {now.model.reason})", highlight=False)
        compacts = (
            f", compacts at {agent.compact_at(client.context_window, client.max_output_tokens):,}"
            if agent.compact_at is not None
            else ""
        )
        console.print(
            f"{agent.name}: output budget {client.max_output_tokens:,} tokens{compacts}",
            highlight=False,
        )
