"""The `mlx` command tree as plain data: each command's path, options and what their values are.
The shell completion scripts are generated from it, and tests walk it (every command has
examples in its help); it reads click's public parameter attributes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mlxlaunch.cli.options import MODEL_METAVAR

# What a value is, for completion: a model name, a file or directory, or free text.
ValueKind = Literal["model", "path", "text"]

# `--debug` is a root option that main() accepts after any subcommand too (it moves it first).
GLOBAL_FLAGS = (("--debug", "Show tracebacks and debug logs."),)


@dataclass(frozen=True)
class OptionSpec:
    """One option: its spellings, one line of help, and the kind of value it takes."""

    flags: tuple[str, ...]
    help: str
    value: ValueKind | None = None  # None: a flag, it takes no value


@dataclass
class CommandNode:
    """One command (or group) of the tree: its path, options, argument and sub-commands."""

    path: tuple[str, ...]
    help: str
    full_help: str = ""
    options: list[OptionSpec] = field(default_factory=list)
    argument: ValueKind | None = None  # what its first positional argument is, if it has one
    children: list[CommandNode] = field(default_factory=list)

    def walk(self) -> list[CommandNode]:
        """This node and every node under it, depth first, in sorted order."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out

    def flags_taking(self, kind: ValueKind) -> list[str]:
        """The spellings of this command's options whose value is a `kind`."""
        return [flag for o in self.options if o.value == kind for flag in o.flags]

    @property
    def flag_names(self) -> list[str]:
        """Every option spelling of this command."""
        return [flag for o in self.options for flag in o.flags]


def first_line(text: str | None) -> str:
    """The first line of a help text, made safe to quote in any of the three shells."""
    stripped = (text or "").strip()
    line = stripped.splitlines()[0] if stripped else ""
    for bad, good in (("'", ""), ('"', ""), ("[", "("), ("]", ")"), ("`", ""), ("$", "")):
        line = line.replace(bad, good)
    return line[:70]


def _is_path(param: Any) -> bool:
    # Typer >= 0.2x describes a parameter's type in `type_descriptor` (its click has no
    # ParamType objects); older typer and plain click name it in `type.name`. A test checks
    # that `--cache-dir` is still seen as a path.
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return bool(descriptor.is_path or descriptor.is_file)
    return getattr(getattr(param, "type", None), "name", "") in ("path", "filename")


def value_kind(param: Any) -> ValueKind | None:
    """What `param` (a click option or argument) takes: None for a flag."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if param.metavar == MODEL_METAVAR:
        return "model"
    return "path" if _is_path(param) else "text"


def command_tree(cmd: Any, path: tuple[str, ...] = ()) -> CommandNode:
    """Walk a click command (all of `mlx`: cli/commands.py's `root_command()`) into a plain
    tree, sorted for stability."""
    summary = getattr(cmd, "short_help", None) or cmd.help
    node = CommandNode(path=path, help=first_line(summary), full_help=cmd.help or "")
    for param in cmd.params:
        # Typer vendors its own click: tell options from arguments by their kind, not class.
        kind = getattr(param, "param_type_name", "")
        if kind == "argument" and node.argument is None:
            node.argument = value_kind(param) if param.nargs == 1 else "text"
        elif kind == "option" and not getattr(param, "hidden", False):
            flags = (*param.opts, *param.secondary_opts)
            node.options.append(OptionSpec(flags, first_line(param.help), value_kind(param)))
    if path:
        node.options += [OptionSpec((flag,), text) for flag, text in GLOBAL_FLAGS]
    node.options.append(OptionSpec(("-h", "--help"), "Show help."))
    for name, sub in sorted(subcommands(cmd).items()):
        if not sub.hidden:
            node.children.append(command_tree(sub, (*path, name)))
    return node


def subcommands(cmd: Any) -> dict[str, Any]:
    """A group's commands by name, each built (the root builds its own on first use, see
    cli/lazy_group.py); {} for a command. Neither click nor Typer reads the context here."""
    if not hasattr(cmd, "list_commands"):
        return {}
    built = {name: cmd.get_command(None, name) for name in cmd.list_commands(None)}
    return {name: sub for name, sub in built.items() if sub is not None}
