"""`mlx launch claude`: one command from a shell to a Claude Code session on a local model."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from mlxlaunch.cli.app import app
from mlxlaunch.cli.cache_options import (
    DEFAULT_CACHE_DISK,
    CacheDirOption,
    CacheDiskOption,
    CacheMemoryOption,
)
from mlxlaunch.cli.scheduler_options import (
    DEFAULT_IDLE_CLEAR,
    DEFAULT_MEMORY_FRACTION,
    ContextLengthOption,
    IdleClearOption,
    KeepAliveOption,
    MaxConcurrencyOption,
    MemoryFractionOption,
)
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_env import export_lines, launch_variables, parse_env_pairs
from mlxlaunch.store.catalog import recommend

# The session and --print-env need the engine (mlx, mlx-lm): imported inside the command, so
# `mlx --help` and the other commands do not pay for them.

launch_app = typer.Typer(
    name="launch",
    help="Start a client (Claude Code) against a local model served by this process.",
    no_args_is_help=True,
)
app.add_typer(launch_app)

_console = Console(stderr=True)

CLAUDE_HELP = """Run Claude Code against a local model.

Starts the model server on 127.0.0.1 (a free port, a fresh token), then `claude` with the \
environment that points it there. Everything after `--` goes to claude unchanged. The server \
stops when claude exits, and `mlx launch` exits with claude's exit code.

Examples:

  mlx launch claude --model qwen-coder-7b

  mlx launch claude -- -p "explain this repo" --allowedTools Bash

  eval "$(mlx launch claude --print-env)"   # use a running `mlx serve` from this shell
"""


def _offer_pull(console: Console, yes: bool) -> bool:
    """Pull the recommended model if the user agrees (or said --yes); True when pulled."""
    entry = recommend()
    if entry is None or not (yes or sys.stdin.isatty()):
        return False
    question = f"No model is downloaded. Pull the recommended {entry.alias} ({entry.repo_id})?"
    if not yes and not typer.confirm(question, default=True, err=True):
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
    claude_args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for claude, after `--`.", show_default=False),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Alias, repo id, local path, or `demo`."),
    ] = None,
    small_model: Annotated[
        str | None, typer.Option(help="Model id for Claude Code's haiku tier (background work).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port to serve on (default: a free one).")
    ] = None,
    context_length: ContextLengthOption = None,
    max_output_tokens: Annotated[
        int | None, typer.Option(min=1, help="Claude Code's output budget (default: window/4).")
    ] = None,
    keep_alive: KeepAliveOption = None,
    max_concurrency: MaxConcurrencyOption = None,
    idle_clear: IdleClearOption = DEFAULT_IDLE_CLEAR,
    memory_fraction: MemoryFractionOption = DEFAULT_MEMORY_FRACTION,
    cache_memory: CacheMemoryOption = "auto",
    cache_dir: CacheDirOption = None,
    cache_disk: CacheDiskOption = DEFAULT_CACHE_DISK,
    preload: Annotated[
        bool, typer.Option("--preload", help="Load the model before claude starts.")
    ] = False,
    claude_bin: Annotated[
        str | None, typer.Option(help="The claude executable (default: `claude` on PATH).")
    ] = None,
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
    from mlxlaunch.launch.session import LaunchOptions, launch_claude

    options = LaunchOptions(
        model=model,
        small_model=small_model,
        port=port,
        context_length=context_length,
        keep_alive=keep_alive,
        max_concurrency=max_concurrency,
        idle_clear=idle_clear,
        memory_fraction=memory_fraction,
        cache_memory=cache_memory,
        cache_dir=cache_dir,
        cache_disk=cache_disk,
        max_output_tokens=max_output_tokens,
        preload=preload,
        claude_bin=claude_bin,
        claude_args=claude_args or [],
        extra_env=extra,
        verbose=verbose,
    )
    code = launch_claude(options, console=_console, offer_pull=lambda: _offer_pull(_console, yes))
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit with claude's code at once; everything was already stopped and cleaned up.

    After mlx-lm generated on a thread other than the main one, interpreter teardown aborts
    about half the time ("terminate called without an active exception", exit 134), which
    would replace claude's exit code. Skipping the teardown keeps the code exact.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
