"""`mlx` run as a child process, as a user's shell runs it: for the tests of what a real
process does (exit codes, signals, files it leaves), through the console script's own entry."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# `mlx` as the console script runs it.
MLX = [sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()"]


def run_quietly(
    argv: Sequence[str], env: dict[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end with no terminal (stdin from /dev/null), its output as text."""
    return subprocess.run(
        list(argv),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def run_mlx(
    args: Sequence[str], env: dict[str, str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`mlx ARGS` run to its end with no terminal (see `run_quietly`)."""
    return run_quietly([*MLX, *args], env, timeout, cwd)
