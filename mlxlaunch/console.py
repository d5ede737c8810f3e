"""The `mlx` console script: imports the CLI, so that Ctrl-C while it loads ends quietly.

Importing the CLI (typer, rich) takes about a fifth of a second; an interrupt then would
otherwise print a KeyboardInterrupt traceback before `cli.main` can turn it into exit 130.

One invocation skips the CLI altogether: `mlx models list --names`, which the shell
completion scripts (cli/completions.py) run on every TAB of a model name. It prints what the
command prints, from the same function, without importing typer or the command modules.
"""

from __future__ import annotations

import sys

# What the completion scripts run (cli/completions.py LOCAL_NAMES_COMMAND), word for word.
MODEL_NAMES_QUERY = ("models", "list", "--names")


def print_model_names() -> None:
    """`mlx models list --names`, answered without the CLI."""
    from mlxlaunch.store.inventory import local_model_names

    for name in local_model_names():
        print(name)


def run() -> None:
    """Entry point of the `mlx` command and of `python -m mlxlaunch`."""
    try:
        if tuple(sys.argv[1:]) == MODEL_NAMES_QUERY:
            print_model_names()
            return
        from mlxlaunch.cli.main import entry
    except KeyboardInterrupt:
        sys.exit(130)
    entry()
