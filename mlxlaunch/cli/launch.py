"""`mlx launch claude | codex | opencode`: one command from a shell to an agent on a local model.

One command per entry of the integrations table (launch/integrations.py); they share the
serving options (`_ServeArgs`) and one run path (`_run`), so an agent is an entry there plus a
command here that names its own binary and install flags.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from mlxlaunch.cli.app import overrides
from mlxlaunch.cli.cluster_options import (
    BackendOption,
    HostfileOption,
    HostsOption,
    ParallelOption,
)
from mlxlaunch.cli.consoles import stderr_console
from mlxlaunch.cli.engine_options import ENGINE_DEFAULTS, takes_engine_options
from mlxlaunch.cli.options import MODEL_METAVAR, model_option
from mlxlaunch.cluster.hosts import cluster_from_options
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.agent_bin import find_or_install_agent
from mlxlaunch.launch.claude_env import export_lines, launch_variables, parse_env_pairs
from mlxlaunch.launch.integrations import (
    CLAUDE,
    CLAUDE_CODE_VERSION,
    CODEX,
    OPENCODE,
    Integration,
)
from mlxlaunch.launch.node import NODE_FIX, node_facts, node_problem, runs_under_node
from mlxlaunch.launch.options import EngineOptions, LaunchOptions
from mlxlaunch.launch.terminal_check import check_claude_can_start
from mlxlaunch.store.catalog import catalog_entry, recommend
from mlxlaunch.store.compute import this_machine
from mlxlaunch.store.memory import format_bytes

# The session and --print-env need the engine (mlx, mlx-lm): imported inside the command, so
# `mlx --help` and the other commands do not pay for them.

launch_app = typer.Typer(
    name="launch",
    help=(
        "Start a client (Claude Code, Codex, opencode) against a local model served by this "
        "process.\n\n"
        "Examples:\n\n"
        "  mlx launch claude --model qwen-coder-7b\n\n"
        '  mlx launch claude --model demo -- -p "say hello"\n\n'
        '  mlx launch codex --model qwen-coder-7b -- exec "fix the tests"'
    ),
    no_args_is_help=True,
)

_console = stderr_console()

CLAUDE_HELP = f"""Run Claude Code against a local model.

Starts the model server on 127.0.0.1 (a free port, a fresh token), then `claude` with the \
environment that points it there. Everything after `--` goes to claude unchanged. The server \
stops when claude exits, and `mlx launch` exits with claude's exit code.

The claude it runs: --claude-bin, else `claude` on PATH, else the Claude Code \
{CLAUDE_CODE_VERSION} that --install-claude installs with npm (asked first on a terminal).

Examples:

  mlx launch claude --model qwen-coder-7b

  mlx launch claude --install-claude --model demo

  mlx launch claude -- -p "explain this repo" --allowedTools Bash

  eval "$(mlx launch claude --print-env)"  # for a running mlx serve
"""


def _offer_pull(console: Console, yes: bool, name: str | None) -> bool:
    """Pull `name` (None: the recommended model) if the user agrees, or said --yes; True when
    pulled. Without a terminal and without --yes nothing is asked and nothing pulled."""
    if not (yes or sys.stdin.isatty()):
        return False
    if name is None:
        entry = recommend()
        if entry is None:
            return False
        name = entry.alias
        question = (
            f"No model is downloaded. Pull the recommended {entry.alias} ({entry.repo_id}, "
            f"{format_bytes(entry.size_bytes)} download, suits {this_machine().describe()})?"
        )
    else:
        known = catalog_entry(name)
        what = (
            f"{known.repo_id}, {format_bytes(known.size_bytes)} download"
            if known
            else "from the hub"
        )
        question = f"{name} is not downloaded. Pull it now ({what})?"
    # No by default: a stray Enter must not start a download of gigabytes.
    if not yes and not typer.confirm(question, default=False, err=True):
        return False
    from mlxlaunch.store.progress import RichPullProgress
    from mlxlaunch.store.pull import plan_pull, pull

    pull(plan_pull(name), progress=RichPullProgress(console, label=name))
    return True


def _print_env(
    url: str | None,
    token: str | None,
    model: str | None,
    small_model: str | None,
    context_length: int | None,
    max_output_tokens: int | None,
    extra: dict[str, str],
) -> None:
    from mlxlaunch.launch.print_env import print_env_target

    target = print_env_target(
        url=url,
        token=token,
        model=model,
        small_model=small_model,
        context_length=context_length,
        max_output_tokens=max_output_tokens,
    )
    typer.echo(export_lines({**launch_variables(target), **extra}))


# Options every `mlx launch <agent>` command takes, defined once.
ModelArg = Annotated[str | None, model_option("Alias, repo id, local path, or `demo`.")]
PortOption = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Port to serve on (default: a free one).")
]
YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Pull the recommended model without asking.")
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Say more.")]
UrlOption = Annotated[str | None, typer.Option(help="With --print-env: the server's URL.")]
TokenOption = Annotated[str | None, typer.Option(help="With --print-env: the server's token.")]
# The same two for the other agents, whose flag is --print-config.
ConfigUrlOption = Annotated[
    str | None, typer.Option("--url", help="With --print-config: the server's URL.")
]
ConfigTokenOption = Annotated[
    str | None, typer.Option("--token", help="With --print-config: the server's token.")
]


def _preload_option(agent: str, default: bool | None = None) -> Any:
    """`--preload`, naming the agent; `default` given: the old-style default-value form."""
    spelling = ("--preload",) if default is None else (default, "--preload")
    return typer.Option(*spelling, help=f"Load the model before {agent} starts.")


def _env_option(agent: str, default: list[str] | bool | None = False) -> Any:
    """`--env/-e`, naming the agent; `default` not False: the old-style default-value form."""
    spelling = ("--env", "-e") if default is False else (default, "--env", "-e")
    return typer.Option(*spelling, help=f"Extra KEY=VALUE for {agent}'s environment (repeat).")


@launch_app.command("claude", help=CLAUDE_HELP, no_args_is_help=False)
@takes_engine_options()
def claude(
    ctx: typer.Context,
    claude_args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for claude, after `--`.", show_default=False),
    ] = None,
    model: ModelArg = None,
    small_model: Annotated[
        str | None,
        typer.Option(
            metavar=MODEL_METAVAR,
            help="A small model served beside the main one for Claude Code's haiku tier "
            "(titles, summaries, background work); default: the default-small-model setting.",
        ),
    ] = None,
    port: PortOption = None,
    max_output_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="Claude Code's output budget (default: window/4, less under 52k)."
        ),
    ] = None,
    engine: EngineOptions = ENGINE_DEFAULTS,  # every engine option (cli/engine_options.py)
    preload: Annotated[bool, _preload_option("claude")] = False,
    hosts: HostsOption = None,
    hostfile: HostfileOption = None,
    backend: BackendOption = None,
    parallel: ParallelOption = "auto",
    claude_bin: Annotated[
        str | None,
        typer.Option(help="The claude to run (default: `claude` on PATH, else the pinned one)."),
    ] = None,
    install_claude: Annotated[
        bool,
        typer.Option(
            CLAUDE.install_flag,
            help=f"If no claude is found, install Claude Code {CLAUDE_CODE_VERSION} (npm) "
            "without asking.",
        ),
    ] = False,
    env: Annotated[list[str] | None, _env_option("claude")] = None,
    yes: YesOption = False,
    verbose: VerboseOption = False,
    print_env: Annotated[
        bool,
        typer.Option("--print-env", help="Print export lines for a running server, then exit."),
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    try:
        extra = parse_env_pairs(env or [])
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if print_env:
        _print_env(url, token, model, small_model, engine.context_length, max_output_tokens, extra)
        return
    # Everything that can fail without the model fails before it loads.
    check_claude_can_start(
        claude_args or [], stdin_tty=sys.stdin.isatty(), stdout_tty=sys.stdout.isatty()
    )
    cluster = cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel)
    found = _claude_to_run(claude_bin, install_claude)
    options = LaunchOptions(
        model=model,
        small_model=small_model,
        port=port,
        engine=engine,
        max_output_tokens=max_output_tokens,
        preload=preload,
        agent_bin=str(found),
        agent_args=claude_args or [],
        extra_env=extra,
        verbose=verbose,
        cluster=cluster,
    )
    _run(CLAUDE, ctx, options, yes)


def _run(agent: Integration, ctx: typer.Context, options: LaunchOptions, yes: bool) -> None:
    """Serve the model, run the agent against it as `options` say, exit with its code."""
    from mlxlaunch.launch.session import launch_agent

    given = overrides(ctx)
    code = launch_agent(
        agent,
        options,
        console=_console,
        offer_pull=lambda name: _offer_pull(_console, yes, name),
        logits_hook=given.logits_hook,
        rank_command=given.rank_command,
    )
    _exit_now(code)


def _agent_help(agent: Integration, example: str) -> str:
    sets = "\n\n".join(f"  {line}" for line in agent.sets)
    return f"""Run {agent.title} against a local model ({agent.api} API).

Starts the model server on 127.0.0.1 (a free port, a fresh token), then `{agent.binary}` \
pointed there; your own {agent.title} configuration files are not read nor written. \
Everything after `--` goes to {agent.binary} unchanged. The server stops when it exits, \
and `mlx launch` exits with its exit code.

The {agent.binary} it runs: --{agent.name}-bin, else `{agent.binary}` on PATH, else the \
{agent.title} {agent.release.version} that {agent.install_flag} installs with npm (asked \
first on a terminal).

What it sets:

{sets}

Examples:

  mlx launch {agent.name} --model qwen-coder-7b

  {example}

  mlx launch {agent.name} --print-config  # for a running mlx serve
"""


def _agent_command(agent: Integration, example: str) -> None:
    """Register `mlx launch <agent>` for an entry of the integrations table (not claude)."""

    args_metavar = f"{agent.name.upper()}_ARGS"

    def command(
        ctx: typer.Context,
        # Plain defaults, not Annotated: the help names `agent`, which a string annotation
        # (from __future__ import annotations) could not see.
        agent_args: list[str] | None = typer.Argument(  # noqa: B008
            None,
            help=f"Arguments for {agent.binary}, after `--`.",
            show_default=False,
            metavar=args_metavar,
        ),
        model: ModelArg = None,
        port: PortOption = None,
        max_output_tokens: Annotated[
            int | None,
            typer.Option(min=1, help="The output budget it is told (default: from the window)."),
        ] = None,
        # Claude Code's auto-mode check (safeguards): no other agent asks it, so not shown.
        engine: EngineOptions = ENGINE_DEFAULTS,
        preload: bool = _preload_option(agent.binary, False),
        agent_bin: str | None = typer.Option(
            None,
            f"--{agent.name}-bin",
            help=f"The {agent.binary} to run (default: on PATH, else the pinned one).",
        ),
        install: bool = typer.Option(
            False,
            agent.install_flag,
            help=f"If no {agent.binary} is found, install {agent.title} "
            f"{agent.release.version} (npm) without asking.",
        ),
        env: list[str] | None = _env_option(agent.binary, None),  # noqa: B008 (see above)
        yes: YesOption = False,
        verbose: VerboseOption = False,
        print_config: Annotated[
            bool,
            typer.Option(
                "--print-config",
                help="Print the settings it would get from a running server, then exit.",
            ),
        ] = False,
        url: ConfigUrlOption = None,
        token: ConfigTokenOption = None,
        hosts: HostsOption = None,
        hostfile: HostfileOption = None,
        backend: BackendOption = None,
        parallel: ParallelOption = "auto",
    ) -> None:
        try:
            extra = parse_env_pairs(env or [])
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if print_config:
            _print_config(agent, url, token, model, engine.context_length, max_output_tokens)
            return
        found = find_or_install_agent(
            agent,
            agent_bin,
            install=install,
            confirm=_ask if sys.stdin.isatty() else None,
            say=_say,
        )
        options = LaunchOptions(
            model=model,
            port=port,
            engine=engine,
            max_output_tokens=max_output_tokens,
            preload=preload,
            agent_bin=str(found),
            agent_args=agent_args or [],
            extra_env=extra,
            verbose=verbose,
            cluster=cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel),
        )
        _run(agent, ctx, options, yes)

    shown = takes_engine_options(hidden={"safeguards"})(command)
    launch_app.command(agent.name, help=_agent_help(agent, example), no_args_is_help=False)(shown)


def _print_config(
    agent: Integration,
    url: str | None,
    token: str | None,
    model: str | None,
    context_length: int | None,
    max_output_tokens: int | None,
) -> None:
    """The files and variables `agent` would get for a running server (token shown as a
    variable reference: the export line carries it)."""
    from mlxlaunch.launch.agent_target import AgentTarget
    from mlxlaunch.launch.print_env import print_env_target

    found = print_env_target(
        url=url,
        token=token,
        model=model,
        context_length=context_length,
        max_output_tokens=max_output_tokens,
    )
    settings = found.settings()
    if settings is None:
        raise ConfigError(
            "the server does not say its context window", hint="pass --context-length"
        )
    from mlxlaunch.launch.session import launch_dirs, prepare_launch_dir

    target = AgentTarget(found.base_url, found.auth_token, settings, cwd=Path.cwd())
    # A real directory, written now, so the export lines work as printed (a CODEX_HOME):
    # one per agent, beside the per-launch ones, rewritten by each --print-config.
    config_dir = launch_dirs(agent) / "print-config"
    setup = agent.configure(target, config_dir)
    prepare_launch_dir(setup, config_dir)
    for name, text in setup.files.items():
        typer.echo(f"# {config_dir / name} (written)\n{text}")
    typer.echo(export_lines(dict(setup.env)))


_agent_command(CODEX, 'mlx launch codex --model demo -- exec "write the proof file"')
_agent_command(OPENCODE, 'mlx launch opencode --model demo -- run "write the proof file"')


def _say(message: str) -> None:
    _console.print(message, markup=False, highlight=False)


def _ask(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)


def _claude_to_run(claude_bin: str | None, install: bool) -> Path:
    """The claude to start; on a terminal, asks before installing the pinned one."""
    found = find_or_install_agent(
        CLAUDE, claude_bin, install=install, confirm=_ask if sys.stdin.isatty() else None, say=_say
    )
    # The pinned release is a native binary; a claude that is a node script needs node 22+.
    if runs_under_node(found):
        problem = node_problem(node_facts())
        if problem is not None:
            _say(f"warning: {problem}; {NODE_FIX}")
    return found


def _exit_now(code: int) -> None:
    """Exit with claude's code at once; everything was already stopped and cleaned up.

    After mlx-lm generated on a thread other than the main one, interpreter teardown aborts
    about half the time ("terminate called without an active exception", exit 134), which
    would replace claude's exit code. Skipping the teardown keeps the code exact.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
