"""`mlx` run as a child process, as a user's shell runs it: for the tests of what a real
process does (exit codes, signals, files it leaves), through the console script's own entry;
and a server process stopped as a user stops it, never left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from deadlines import PROCESS_EXIT_S

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


@contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """`proc` for the block; killed and waited for at its end if it is still running (a test
    that failed half-way leaves no server behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[str], stop_signal: int = signal.SIGINT) -> str:
    """Send `stop_signal` (Ctrl-C by default) and wait for the exit; what it wrote to stderr."""
    proc.send_signal(stop_signal)
    _, err = proc.communicate(timeout=PROCESS_EXIT_S)
    return err
