"""`python -m mlxlaunch` runs the `mlx` command."""

from mlxlaunch.cli.main import entry

entry()
