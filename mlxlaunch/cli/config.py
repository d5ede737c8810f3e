"""`mlx config set/get/unset/show`: the user's settings (default model and launch defaults).

Values are checked by `mlxlaunch.config` when set and when read, so a bad one is refused here
with its reason instead of failing a later launch; a model setting is also checked against
the models mlx knows when it is set (never when read: a model may be removed later, and a
launch then says the name came from this setting).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from mlxlaunch.cli.consoles import stderr_console, stdout_console
from mlxlaunch.cli.error_text import error_text
from mlxlaunch.cli.options import JsonOption
from mlxlaunch.config import KEYS, config_path, load_config, set_value, unset_value
from mlxlaunch.errors import ModelNotFound

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

KeyArg = Annotated[str, typer.Argument(help=f"One of: {', '.join(KEYS)}.", show_default=False)]

_SETTINGS = "\n\n".join(f"  {spec.name}: {spec.help}" for spec in KEYS.values())
SET_HELP = f"""Set one setting; the value is checked now, with the reason when it is refused.

Settings:

{_SETTINGS}

Examples:

  mlx config set default-model qwen-coder-7b

  mlx config set context-length 32768

  mlx config set keep-alive 30m

  mlx config set search.backend searxng

  mlx config set search.url http://127.0.0.1:8888
"""

GET_HELP = """Print one setting (nothing, exit 1, when it is unset).

Examples:

  mlx config get default-model

  mlx launch claude --model "$(mlx config get default-model)"
"""

UNSET_HELP = """Remove one setting, so its default applies again.

Examples:

  mlx config unset keep-alive
"""

SHOW_HELP = """Show every setting, its value and what it does.

Examples:

  mlx config show

  mlx config show --json
"""


@config_app.command("set", help=SET_HELP)
def config_set(key: KeyArg, value: Annotated[str, typer.Argument(show_default=False)]) -> None:
    downloaded = True
    spec = KEYS.get(key)
    if spec is not None and spec.names_model:
        from mlxlaunch.launch.models import checked_model_name

        try:
            value, downloaded = checked_model_name(value.strip())
        except ModelNotFound as exc:
            message, hint = error_text(exc)
            raise ModelNotFound(f"cannot set {key}: {message}", hint=hint) from exc
    stored = set_value(key, value)
    typer.echo(f"{key} = {stored}  ({config_path()})")
    if not downloaded:
        stderr_console().print(
            f"note: {stored} is not downloaded yet: mlx models pull {stored}", highlight=False
        )


@config_app.command("get", help=GET_HELP)
def config_get(key: KeyArg) -> None:
    value = load_config().get(key)
    if value is None:
        raise typer.Exit(1)
    typer.echo(str(value))


@config_app.command("unset", help=UNSET_HELP)
def config_unset(key: KeyArg) -> None:
    removed = unset_value(key)
    typer.echo(f"{key} {'removed' if removed else 'was not set'}")


@config_app.command("show", help=SHOW_HELP)
def config_show(as_json: JsonOption = False) -> None:
    loaded = load_config()
    if as_json:
        # Every known key, null when unset, so scripts need not know which are.
        settings = {key: shown_value(key, loaded.get(key)) for key in KEYS}
        typer.echo(json.dumps({"path": str(config_path()), "settings": settings}, indent=2))
        return
    table = Table(title=str(config_path()), title_justify="left")
    table.add_column("setting")
    table.add_column("value")
    table.add_column("meaning", style="dim")
    for key, spec in KEYS.items():
        value = shown_value(key, loaded.get(key))
        table.add_row(key, "-" if value is None else str(value), spec.help)
    stdout_console().print(table)


def shown_value(key: str, value: object) -> object:
    """A setting as `show` prints it: a secret (an API key) masked to its last four characters
    (`mlx config get` prints it whole, for scripts)."""
    if value is None or not KEYS[key].secret:
        return value
    text = str(value)
    return "****" + text[-4:] if len(text) > 8 else "set"
