"""`mlx launch claude`: one command from a shell to a Claude Code session on a local model."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

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
from mlxlaunch.cli.options import model_option
from mlxlaunch.cli.scheduler_options import (
    DEFAULT_IDLE_CLEAR,
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_RENDER,
    ContextLengthOption,
    IdleClearOption,
    KeepAliveOption,
    MaxConcurrencyOption,
    MemoryFractionOption,
    RenderOption,
    ToolFormatOption,
)
from mlxlaunch.engine.settings import DEFAULT_CACHE_DISK
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_bin import CLAUDE_CODE_VERSION, INSTALL_FLAG
from mlxlaunch.launch.claude_env import export_lines, launch_variables, parse_env_pairs
from mlxlaunch.launch.claude_install import find_or_install
from mlxlaunch.launch.node import NODE_FIX, node_facts, node_problem, runs_under_node
from mlxlaunch.launch.terminal_check import check_claude_can_start
from mlxlaunch.store.catalog import recommend
from mlxlaunch.store.compute import this_machine
from mlxlaunch.store.memory import format_bytes

# The session and --print-env need the engine (mlx, mlx-lm): imported inside the command, so
# `mlx --help` and the other commands do not pay for them.

launch_app = typer.Typer(
    name="launch",
    help=(
        "Start a client (Claude Code) against a local model served by this process.\n\n"
        "Examples:\n\n"
        "  mlx launch claude --model qwen-coder-7b\n\n"
        '  mlx launch claude --model demo -- -p "say hello"'
    ),
    no_args_is_help=True,
)

_console = Console(stderr=True)

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


def _offer_pull(console: Console, yes: bool) -> bool:
    """Pull the recommended model if the user agrees (or said --yes); True when pulled."""
    entry = recommend()
    if entry is None or not (yes or sys.stdin.isatty()):
        return False
    question = (
        f"No model is downloaded. Pull the recommended {entry.alias} ({entry.repo_id}, "
        f"{format_bytes(entry.size_bytes)} download, suits {this_machine().describe()})?"
    )
    # No by default: a stray Enter must not start a download of gigabytes.
    if not yes and not typer.confirm(question, default=False, err=True):
        return False
    from mlxlaunch.store.progress import RichPullProgress
    from mlxlaunch.store.pull import plan_pull, pull

    pull(plan_pull(entry.alias), progress=RichPullProgress(console, label=entry.alias))
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


@launch_app.command("claude", help=CLAUDE_HELP, no_args_is_help=False)
def claude(
    ctx: typer.Context,
    claude_args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for claude, after `--`.", show_default=False),
    ] = None,
    model: Annotated[str | None, model_option("Alias, repo id, local path, or `demo`.")] = None,
    small_model: Annotated[
        str | None, typer.Option(help="Model id for Claude Code's haiku tier (background work).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port to serve on (default: a free one).")
    ] = None,
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
    debug_cache: DebugCacheOption = False,
    safeguards: SafeguardsOption = True,
    preload: Annotated[
        bool, typer.Option("--preload", help="Load the model before claude starts.")
    ] = False,
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
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="Extra KEY=VALUE for claude's environment (repeat)."),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Pull the recommended model without asking.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Say more.")] = False,
    print_env: Annotated[
        bool,
        typer.Option("--print-env", help="Print export lines for a running server, then exit."),
    ] = False,
    url: Annotated[str | None, typer.Option(help="With --print-env: the server's URL.")] = None,
    token: Annotated[str | None, typer.Option(help="With --print-env: the server's token.")] = None,
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
    found = _claude_to_run(claude_bin, install_claude)
    from mlxlaunch.launch.serving import EngineOptions
    from mlxlaunch.launch.session import LaunchOptions, launch_claude

    options = LaunchOptions(
        model=model,
        small_model=small_model,
        port=port,
        engine=EngineOptions(
            context_length=context_length,
            max_concurrency=max_concurrency,
            idle_clear=idle_clear,
            keep_alive=keep_alive,
            memory_fraction=memory_fraction,
            cache_memory=cache_memory,
            cache_dir=cache_dir,
            cache_disk=cache_disk,
            tool_format=tool_format,
            render=render,
            debug_cache=debug_cache,
            safeguards=safeguards,
        ),
        max_output_tokens=max_output_tokens,
        preload=preload,
        claude_bin=str(found),
        claude_args=claude_args or [],
        extra_env=extra,
        verbose=verbose,
    )
    code = launch_claude(
        options,
        console=_console,
        offer_pull=lambda: _offer_pull(_console, yes),
        logits_hook=overrides(ctx).logits_hook,
    )
    _exit_now(code)


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
