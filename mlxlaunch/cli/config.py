"""`mlx config set/get/unset/show`: the user's settings (default model and launch defaults)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlxlaunch.cli.app import app
from mlxlaunch.config import KEYS, config_path, load_config, set_value, unset_value

config_app = typer.Typer(
    name="config",
    help=(
        "Read and change your settings.\n\n"
        "Examples:\n\n"
        "  mlx config set default-model qwen-coder-7b\n\n"
        "  mlx config show"
    ),
    no_args_is_help=True,
)
app.add_typer(config_app)

KeyArg = Annotated[str, typer.Argument(help=f"One of: {', '.join(KEYS)}.", show_default=False)]


@config_app.command("set")
def config_set(key: KeyArg, value: Annotated[str, typer.Argument(show_default=False)]) -> None:
    """Set one setting."""
    stored = set_value(key, value)
    typer.echo(f"{key} = {stored}  ({config_path()})")


@config_app.command("get")
def config_get(key: KeyArg) -> None:
    """Print one setting (nothing, exit 1, when it is unset)."""
    value = load_config().get(key)
    if value is None:
        raise typer.Exit(1)
    typer.echo(str(value))


@config_app.command("unset")
def config_unset(key: KeyArg) -> None:
    """Remove one setting."""
    removed = unset_value(key)
    typer.echo(f"{key} {'removed' if removed else 'was not set'}")


@config_app.command("show")
def config_show() -> None:
    """Show every setting, its value and what it does."""
    loaded = load_config()
    table = Table(title=str(config_path()), title_justify="left")
    table.add_column("setting")
    table.add_column("value")
    table.add_column("meaning", style="dim")
    for key, spec in KEYS.items():
        value = loaded.get(key)
        table.add_row(key, "-" if value is None else str(value), spec.help)
    Console().print(table)
