"""The root group of `mlx`: each command's module is imported when that command runs.

`mlx --help` lists every command but runs none, so it needs only their names and one-line
helps: those are in the table `cli/main.py` registers here (`register`), and a command's
module — with what it imports: the store, the cluster checks, Textual for `mlx dash`, the
benchmark — is imported the first time click asks for that command. Before this, every
`mlx` invocation imported every command's code: 0.9 s for `mlx --help`.

A command is built exactly as the root app would build it (the same Typer settings, through
`typer.main.get_command`), so its help and parsing do not depend on whether it came lazily.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

import typer
from typer.core import TyperGroup

# The Typer settings of the root app that shape its commands (help layout above all); the
# app and every lazily built command use these same ones (cli/app.py).
ROOT_SETTINGS: dict[str, Any] = {
    "pretty_exceptions_enable": False,
    "rich_markup_mode": None,
    "add_completion": False,
}


@dataclass(frozen=True)
class LazyCommand:
    """One command or group of `mlx`, named by where it lives rather than by its object.

    `attribute` names a `typer.Typer` (a group: `mlx models …`) or a command function in
    `mlxlaunch.cli.<module>`; `help_attribute`, the module's constant with a command's help
    (None: its docstring). `short_help` is its line in `mlx --help`.
    """

    name: str
    module: str
    attribute: str
    short_help: str
    help_attribute: str | None = None

    def build(self) -> Any:
        """The click command, built by Typer from the imported object."""
        module = importlib.import_module(f"mlxlaunch.cli.{self.module}")
        target = getattr(module, self.attribute)
        holder = typer.Typer(**ROOT_SETTINGS)
        holder.callback()(_no_options)  # a group, so the command keeps its name under it
        if isinstance(target, typer.Typer):
            holder.add_typer(target, name=self.name, short_help=self.short_help)
        else:
            help_text = getattr(module, self.help_attribute) if self.help_attribute else None
            holder.command(self.name, help=help_text, short_help=self.short_help)(target)
        return typer.main.get_command(holder).commands[self.name]  # type: ignore[attr-defined]


def _no_options() -> None:
    """The placeholder group's callback (never run: only its command is kept)."""


_TABLE: dict[str, LazyCommand] = {}

# Words people bring from Ollama (and from `hf`): what `mlx` calls each, with the first words
# of the command line to suggest (the user's own words follow).
HABITS = {
    "pull": "models pull",
    "list": "models list",
    "ls": "models list",
    "rm": "models rm",
    "show": "models info",
    "info": "models info",
    "recommend": "models recommend",
    "catalog": "models catalog",
    "run": "launch claude --model",
    "chat": "launch claude --model",
}


def register(entry: LazyCommand) -> None:
    """Add `entry` to `mlx` (cli/main.py's table calls this, and nothing else does)."""
    _TABLE[entry.name] = entry


def registered() -> list[LazyCommand]:
    """The table, in the order `mlx --help` lists it."""
    return list(_TABLE.values())


class LazyGroup(TyperGroup):
    """A Typer group whose table entries are built on first use (see the module doc)."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Commands registered on the app itself first (tests add hidden ones), then the
        table's, in its order."""
        return [*self.commands, *(name for name in _TABLE if name not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command `cmd_name`, importing its module the first time it is asked for."""
        if cmd_name not in self.commands and cmd_name in _TABLE:
            self.commands[cmd_name] = _TABLE[cmd_name].build()
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """The command `args` start with; an unknown one is a usage error that says what to
        type instead: the `mlx` spelling of an Ollama habit, or the commands it is close to."""
        try:
            return super().resolve_command(ctx, args)
        except Exception as exc:  # click's UsageError (Typer vendors click: known by shape)
            if args and isinstance(getattr(exc, "message", None), str):
                exc.message = unknown_command_message(args, self.list_commands(ctx))  # type: ignore[attr-defined]
            raise

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The `Commands:` section, from the table's one-line helps: nothing is imported."""
        rows: list[tuple[str, Callable[[int], str] | str]] = []
        for name in self.list_commands(ctx):
            built = self.commands.get(name)
            if built is not None:
                if not built.hidden:
                    rows.append((name, built.get_short_help_str))
            else:
                rows.append((name, _TABLE[name].short_help))
        if not rows:
            return
        # click's own layout: the help column gets what the longest name leaves of the width.
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        lines = [(name, text if isinstance(text, str) else text(limit)) for name, text in rows]
        with formatter.section("Commands"):
            formatter.write_dl(lines)


def unknown_command_message(args: list[str], known: list[str]) -> str:
    """`No such command 'pull'.` and what to type: `mlx models pull ARGS…`, or close names."""
    word, rest = args[0], args[1:]
    message = f"No such command {word!r}."
    habit = HABITS.get(word)
    if habit is not None:
        words = habit.split() + (rest or (["MODEL"] if habit.endswith("--model") else []))
        suggested = shlex.join(["mlx", *words])
        return f"{message} In mlx that is: {suggested}"
    matches = get_close_matches(word, known)
    if matches:
        return f"{message} Did you mean {', '.join(repr(m) for m in matches)}?"
    return message
