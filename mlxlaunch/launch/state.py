"""State files of running servers, so `mlx dash`, `mlx doctor` and the store can find them.

One JSON file per server process: `<home>/run/<pid>.json`, where home is `$MLXLAUNCH_HOME` or
the platform's user cache dir. The file holds the server's URL and bearer token, so it is
written 0600 inside a 0700 directory. A file whose process is gone is stale: readers skip it
and `running_servers` deletes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from mlxlaunch.store.paths import mlxlaunch_home
from mlxlaunch.store.running import pid_alive

RunKind = Literal["launch", "serve"]


def run_dir(home: Path | None = None) -> Path:
    """Directory holding one state file per running server."""
    return (home or mlxlaunch_home()) / "run"


def logs_dir(home: Path | None = None) -> Path:
    """Directory for the server logs of `mlx launch`."""
    return (home or mlxlaunch_home()) / "logs"


@dataclass(frozen=True)
class RunState:
    """What another process needs to reach (or recognise) a running server."""

    pid: int
    url: str
    token: str
    model: str
    model_path: str
    log_file: str
    kind: RunKind = "launch"
    started_at: float = field(default_factory=time.time)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RunState:
        """Parse a state file's content; raises ValueError when a field is missing or wrong."""
        try:
            kind = str(data["kind"])
            if kind not in ("launch", "serve"):
                raise ValueError(f"unknown kind {kind!r}")
            return cls(
                pid=int(data["pid"]),  # type: ignore[call-overload]
                url=str(data["url"]),
                token=str(data["token"]),
                model=str(data["model"]),
                model_path=str(data["model_path"]),
                log_file=str(data["log_file"]),
                kind=kind,  # type: ignore[arg-type]
                started_at=float(data["started_at"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad state file content: {exc}") from exc


def state_path(pid: int, home: Path | None = None) -> Path:
    """Where the state file of process `pid` lives."""
    return run_dir(home) / f"{pid}.json"


def write_state(state: RunState, home: Path | None = None) -> Path:
    """Write the state file atomically with owner-only permissions; returns its path."""
    directory = run_dir(home)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)  # mkdir's mode is masked by umask and skipped if it exists
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
    try:
        return RunState.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def is_stale(state: RunState) -> bool:
    """A state file is stale when its process no longer exists."""
    return not pid_alive(state.pid)


def running_servers(home: Path | None = None, *, prune: bool = True) -> list[RunState]:
    """Live servers, newest first. Stale or malformed files are deleted when `prune`."""
    directory = run_dir(home)
    if not directory.is_dir():
        return []
    live: list[RunState] = []
    for path in directory.glob("*.json"):
        state = read_state(path)
        if state is not None and not is_stale(state):
            live.append(state)
        elif prune:
            with contextlib.suppress(OSError):
                path.unlink()
    live.sort(key=lambda s: s.started_at, reverse=True)
    return live
