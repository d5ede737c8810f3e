"""`python -m mlxlaunch` runs the `mlx` command."""

from mlxlaunch.console import run

run()
