"""mlxlaunch: run Claude Code against a model on your own machine, through MLX."""

__version__ = "0.1.0"
