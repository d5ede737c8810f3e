"""Writing and cleaning up the state records of running servers (format: `mlxlaunch.runstate`).

One JSON file per server process: `<home>/run/<pid>.json`. The file holds the server's URL and
bearer token, so it is written 0600 inside a 0700 directory. A file whose process is gone is
stale: readers skip it and `running_servers` (re-exported from `mlxlaunch.runstate`, the one
place that decides what is running) deletes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from mlxlaunch.home import mlxlaunch_home, private_dir
from mlxlaunch.runstate import (
    ClientSettings,
    RunKind,
    RunState,
    pid_alive,
    read_record,
    run_dir,
    running_servers,
)

__all__ = [
    "ClientSettings",
    "RunKind",
    "RunState",
    "is_stale",
    "logs_dir",
    "pid_alive",
    "read_state",
    "remove_state",
    "run_dir",
    "running_servers",
    "state_path",
    "write_state",
]


def logs_dir(home: Path | None = None) -> Path:
    """Directory for the server logs of `mlx launch`."""
    return (home or mlxlaunch_home()) / "logs"


def state_path(pid: int, home: Path | None = None) -> Path:
    """Where the state file of process `pid` lives."""
    return run_dir(home) / f"{pid}.json"


def write_state(state: RunState, home: Path | None = None) -> Path:
    """Write the state file atomically with owner-only permissions; returns its path."""
    directory = run_dir(home)
    private_dir(directory)  # and the home: 0700 whatever the umask
    os.chmod(directory, 0o700)  # it may exist from an older version with a wider mode
    path = state_path(state.pid, home)
    tmp = directory / f".{state.pid}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(state), f, indent=2)
    os.replace(tmp, path)
    return path


def remove_state(pid: int, home: Path | None = None) -> None:
    """Delete the state file of `pid` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        state_path(pid, home).unlink()


def read_state(path: Path) -> RunState | None:
    """Parse one state file; None when it is unreadable or malformed."""
    return read_record(path)


def is_stale(state: RunState) -> bool:
    """A state file is stale when its process no longer exists."""
    return not pid_alive(state.pid)
