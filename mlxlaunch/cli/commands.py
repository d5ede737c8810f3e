"""The table of every command and group of `mlx`, and the root app with all of them on it.

The command line (cli/main.py) runs the app from here. The command tree (cli/command_tree.py)
imports no command: it walks the click command it is given — `mlx completions` its own root
(from click's context), tests `root_command()` — so the table, the completions command and
the tree depend one way.
"""

from __future__ import annotations

from typing import Any

import typer

from mlxlaunch.cli.app import app
from mlxlaunch.cli.lazy_group import LazyCommand, register

__all__ = ["COMMANDS", "app", "root_command"]

# Every command and group of `mlx`, registered here and nowhere else (as huggingface_hub's
# `hf.py` does), by module and name: a command's module is imported when it runs
# (cli/lazy_group.py), so `mlx --help` and the shell completion's `mlx models list --names`
# import nothing they do not use. `mlx --help` lists them in this order. A new command adds
# one line; `short_help` is its line in that list, short enough to show whole at 80 columns.
COMMANDS = (
    LazyCommand("serve", "serve", "serve", "Serve a model (Anthropic Messages API).", "SERVE_HELP"),
    LazyCommand("ps", "ps", "ps", "List the mlx servers running here.", "PS_HELP"),
    LazyCommand("stop", "ps", "stop", "Stop a running mlx server.", "STOP_HELP"),
    LazyCommand("doctor", "doctor", "doctor", "Check this machine and suggest fixes."),
    LazyCommand("dash", "dash", "dash", "Watch a running server live.", "DASH_HELP"),
    LazyCommand("bench", "bench", "bench", "Measure time to first token and decode speed."),
    LazyCommand("completions", "completions", "completions", "Print shell completion scripts."),
    LazyCommand(
        "launch",
        "launch",
        "launch_app",
        "Start an agent (Claude Code, Codex, opencode) on a local model.",
    ),
    LazyCommand(
        "models", "models", "models_app", "Manage local MLX models (the Hugging Face hub cache)."
    ),
    LazyCommand("config", "config", "config_app", "Read and change your settings."),
)
for command in COMMANDS:
    register(command)


def root_command() -> Any:
    """The click command behind the complete `mlx` app."""
    return typer.main.get_command(app)
