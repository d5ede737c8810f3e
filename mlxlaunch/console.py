"""The `mlx` console script: imports the CLI, so that Ctrl-C while it loads ends quietly.

Importing the CLI (typer, rich, pydantic) takes about half a second; an interrupt then would
otherwise print a KeyboardInterrupt traceback before `cli.main` can turn it into exit 130.
"""

from __future__ import annotations

import sys


def run() -> None:
    """Entry point of the `mlx` command and of `python -m mlxlaunch`."""
    try:
        from mlxlaunch.cli.main import entry
    except KeyboardInterrupt:
        sys.exit(130)
    entry()
