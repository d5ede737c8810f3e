"""`mlx launch claude | codex | opencode`: one command from a shell to an agent on a local model.

One command per entry of the integrations table (launch/integrations.py); they share the
serving options (`_ServeArgs`) and one run path (`_run`), so an agent is an entry there plus a
command here that names its own binary and install flags.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from mlxlaunch.cli.app import overrides
from mlxlaunch.cli.cache_options import (
    CacheDirOption,
    CacheDiskOption,
    CacheMemoryOption,
    DebugCacheOption,
    SafeguardsOption,
)
from mlxlaunch.cli.cluster_options import (
    BackendOption,
    HostfileOption,
    HostsOption,
    ParallelOption,
)
from mlxlaunch.cli.consoles import stderr_console
from mlxlaunch.cli.options import model_option
from mlxlaunch.cli.scheduler_options import (
    DEFAULT_IDLE_CLEAR,
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_RENDER,
    DEFAULT_SPECULATE,
    ContextLengthOption,
    DraftModelOption,
    IdleClearOption,
    KeepAliveOption,
    KvBitsOption,
    KvGroupSizeOption,
    MaxConcurrencyOption,
    MemoryFractionOption,
    RenderOption,
    SpeculateOption,
    ToolFormatOption,
)
from mlxlaunch.cluster.hosts import Cluster, cluster_from_options
from mlxlaunch.engine.settings import DEFAULT_CACHE_DISK
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_bin import CLAUDE_CODE_VERSION, INSTALL_FLAG
from mlxlaunch.launch.claude_env import export_lines, launch_variables, parse_env_pairs
from mlxlaunch.launch.claude_install import find_or_install
from mlxlaunch.launch.integrations import CLAUDE, CODEX, OPENCODE, Integration
from mlxlaunch.launch.node import NODE_FIX, node_facts, node_problem, runs_under_node
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
def claude(
    ctx: typer.Context,
    claude_args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for claude, after `--`.", show_default=False),
    ] = None,
    model: ModelArg = None,
    small_model: Annotated[
        str | None, typer.Option(help="Model id for Claude Code's haiku tier (background work).")
    ] = None,
    port: PortOption = None,
    context_length: ContextLengthOption = None,
    max_output_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="Claude Code's output budget (default: window/4, less under 52k)."
        ),
    ] = None,
    keep_alive: KeepAliveOption = None,
    max_concurrency: MaxConcurrencyOption = None,
    idle_clear: IdleClearOption = DEFAULT_IDLE_CLEAR,
    memory_fraction: MemoryFractionOption = DEFAULT_MEMORY_FRACTION,
    cache_memory: CacheMemoryOption = "auto",
    cache_dir: CacheDirOption = None,
    cache_disk: CacheDiskOption = DEFAULT_CACHE_DISK,
    tool_format: ToolFormatOption = None,
    render: RenderOption = DEFAULT_RENDER,
    speculate: SpeculateOption = DEFAULT_SPECULATE,
    draft_model: DraftModelOption = None,
    kv_bits: KvBitsOption = None,
    kv_group_size: KvGroupSizeOption = None,
    debug_cache: DebugCacheOption = False,
    safeguards: SafeguardsOption = True,
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
            INSTALL_FLAG,
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
        _print_env(url, token, model, small_model, context_length, max_output_tokens, extra)
        return
    # Everything that can fail without the model fails before it loads.
    check_claude_can_start(
        claude_args or [], stdin_tty=sys.stdin.isatty(), stdout_tty=sys.stdout.isatty()
    )
    cluster = cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel)
    found = _claude_to_run(claude_bin, install_claude)
    _run(
        CLAUDE,
        ctx,
        found,
        claude_args or [],
        _ServeArgs(
            model=model,
            small_model=small_model,
            port=port,
            context_length=context_length,
            max_output_tokens=max_output_tokens,
            keep_alive=keep_alive,
            max_concurrency=max_concurrency,
            idle_clear=idle_clear,
            memory_fraction=memory_fraction,
            cache_memory=cache_memory,
            cache_dir=cache_dir,
            cache_disk=cache_disk,
            tool_format=tool_format,
            render=render,
            speculate=speculate,
            draft_model=draft_model,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
            debug_cache=debug_cache,
            safeguards=safeguards,
            preload=preload,
            extra_env=extra,
            verbose=verbose,
            yes=yes,
            cluster=cluster,
        ),
    )


@dataclass(frozen=True)
class _ServeArgs:
    """The serving options every `mlx launch <agent>` takes, as parsed."""

    model: str | None
    port: int | None
    context_length: int | None
    max_output_tokens: int | None
    keep_alive: str | None
    max_concurrency: int | None
    idle_clear: str | None
    memory_fraction: float | None
    cache_memory: str
    cache_dir: Path | None
    cache_disk: str
    tool_format: str | None
    render: str
    speculate: str
    draft_model: str | None
    kv_bits: int | None
    kv_group_size: int | None
    debug_cache: bool
    safeguards: bool
    preload: bool
    extra_env: dict[str, str]
    verbose: bool
    yes: bool
    small_model: str | None = None
    cluster: Cluster | None = None


def _run(
    agent: Integration, ctx: typer.Context, binary: Path, args: list[str], a: _ServeArgs
) -> None:
    """Serve the model, run `binary` with `args` against it, exit with its code."""
    from mlxlaunch.launch.serving import EngineOptions
    from mlxlaunch.launch.session import LaunchOptions, launch_agent

    options = LaunchOptions(
        model=a.model,
        small_model=a.small_model,
        port=a.port,
        engine=EngineOptions(
            context_length=a.context_length,
            max_concurrency=a.max_concurrency,
            idle_clear=a.idle_clear,
            keep_alive=a.keep_alive,
            memory_fraction=a.memory_fraction,
            cache_memory=a.cache_memory,
            cache_dir=a.cache_dir,
            cache_disk=a.cache_disk,
            tool_format=a.tool_format,
            render=a.render,
            speculate=a.speculate,
            draft_model=a.draft_model,
            kv_bits=a.kv_bits,
            kv_group_size=a.kv_group_size,
            debug_cache=a.debug_cache,
            safeguards=a.safeguards,
        ),
        max_output_tokens=a.max_output_tokens,
        preload=a.preload,
        agent_bin=str(binary),
        agent_args=args,
        extra_env=a.extra_env,
        verbose=a.verbose,
        cluster=a.cluster,
    )
    given = overrides(ctx)
    code = launch_agent(
        agent,
        options,
        console=_console,
        offer_pull=lambda name: _offer_pull(_console, a.yes, name),
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
        context_length: ContextLengthOption = None,
        max_output_tokens: Annotated[
            int | None,
            typer.Option(min=1, help="The output budget it is told (default: from the window)."),
        ] = None,
        keep_alive: KeepAliveOption = None,
        max_concurrency: MaxConcurrencyOption = None,
        idle_clear: IdleClearOption = DEFAULT_IDLE_CLEAR,
        memory_fraction: MemoryFractionOption = DEFAULT_MEMORY_FRACTION,
        cache_memory: CacheMemoryOption = "auto",
        cache_dir: CacheDirOption = None,
        cache_disk: CacheDiskOption = DEFAULT_CACHE_DISK,
        tool_format: ToolFormatOption = None,
        render: RenderOption = DEFAULT_RENDER,
        speculate: SpeculateOption = DEFAULT_SPECULATE,
        draft_model: DraftModelOption = None,
        kv_bits: KvBitsOption = None,
        kv_group_size: KvGroupSizeOption = None,
        debug_cache: DebugCacheOption = False,
        # Claude Code's auto-mode check: no other agent asks it, so it is not offered here.
        safeguards: Annotated[
            bool, typer.Option("--safeguards/--no-safeguards", hidden=True)
        ] = True,
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
            _print_config(agent, url, token, model, context_length, max_output_tokens)
            return
        from mlxlaunch.launch.agent_bin import find_or_install_agent

        found = find_or_install_agent(
            agent,
            agent_bin,
            install=install,
            confirm=_ask if sys.stdin.isatty() else None,
            say=_say,
        )
        serve = _ServeArgs(
            model=model,
            port=port,
            context_length=context_length,
            max_output_tokens=max_output_tokens,
            keep_alive=keep_alive,
            max_concurrency=max_concurrency,
            idle_clear=idle_clear,
            memory_fraction=memory_fraction,
            cache_memory=cache_memory,
            cache_dir=cache_dir,
            cache_disk=cache_disk,
            tool_format=tool_format,
            render=render,
            speculate=speculate,
            draft_model=draft_model,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
            debug_cache=debug_cache,
            safeguards=safeguards,
            preload=preload,
            extra_env=extra,
            verbose=verbose,
            yes=yes,
            cluster=cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel),
        )
        _run(agent, ctx, found, agent_args or [], serve)

    launch_app.command(agent.name, help=_agent_help(agent, example), no_args_is_help=False)(command)


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
    found = find_or_install(
        claude_bin, install=install, confirm=_ask if sys.stdin.isatty() else None, say=_say
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
