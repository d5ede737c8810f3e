"""The root Typer app of the `mlx` command, with no commands on it.

`mlxlaunch.cli.main` registers every command and group on `app`, in one table; no module
registers itself when imported.

Help is click's plain layout (`rich_markup_mode=None`): rich's option table shares its width
among six columns and truncates long option names at 80 columns (`--concurrency-p…`), while
click's layout wraps only the help text, so every option name and example shows whole.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from mlxlaunch import __version__

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
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Completion comes from `mlx completions` (static scripts), not typer's call-back scripts.
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
        logging.basicConfig(level=logging.DEBUG)
