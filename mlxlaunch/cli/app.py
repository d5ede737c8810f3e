"""The root Typer app of the `mlx` command, with no commands on it.

`mlxlaunch.cli.main` registers every command and group on `app`, in one table; no module
registers itself when imported. `Overrides` is what `main()` may hand the commands through
click's context object instead of their defaults (the serving commands' logits hook).

Help is click's plain layout (`rich_markup_mode=None`): rich's option table shares its width
among six columns and truncates long option names at 80 columns (`--concurrency-p…`), while
click's layout wraps only the help text, so every option name and example shows whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from mlxlaunch import __version__
from mlxlaunch.cli.lazy_group import ROOT_SETTINGS, LazyGroup

if TYPE_CHECKING:
    from mlxlaunch.engine.config import LogitsHook

app = typer.Typer(
    name="mlx",
    help=(
        "Run Claude Code and other Anthropic-API clients against local models through MLX.\n\n"
        "Examples:\n\n"
        "  mlx launch claude --model qwen-coder-7b\n\n"
        "  mlx serve --model demo\n\n"
        "  mlx models pull qwen-coder-7b\n\n"
        "  mlx bench --quick --model tiny"
    ),
    no_args_is_help=True,
    # Commands are built when used (cli/lazy_group.py); ROOT_SETTINGS: rich_markup_mode=None,
    # no pretty exceptions, and completion from `mlx completions` (static scripts), not
    # typer's call-back scripts.
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    **ROOT_SETTINGS,
)


@dataclass(frozen=True)
class Overrides:
    """What a caller of `cli.main.main()` hands the serving commands in place of their defaults.

    The `mlx` command hands nothing. Tests that run `mlx serve` or `mlx launch claude` as a
    process script the model's output through it (tests/scripted_mlx.py), so the product
    reads no test hook from the environment.
    """

    logits_hook: LogitsHook | None = None
    # How a cluster's ranks are started (`mlx.launch` runs it with python on each host);
    # None: `-m mlxlaunch.launch.cluster_rank`. Tests put their scripted rank 0 here.
    rank_command: tuple[str, ...] | None = None


def overrides(ctx: typer.Context) -> Overrides:
    """The Overrides `main()` was given (none: the defaults)."""
    found = ctx.find_object(Overrides)
    return found if found is not None else Overrides()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlx (mlxlaunch) {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show tracebacks and debug logs (also accepted after the command).",
            envvar="MLX_DEBUG",
        ),
    ] = False,
) -> None:
    """mlxlaunch: local models for Claude Code, through MLX."""
    if debug:
        from mlxlaunch.launch.server_log import LOG_FORMAT, PlainTextFormatter

        logging.basicConfig(level=logging.DEBUG)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(PlainTextFormatter(LOG_FORMAT))
