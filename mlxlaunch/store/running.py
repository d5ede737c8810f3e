"""Which models running mlxlaunch servers have loaded: a token-less view of their state records.

The record format, its parser and the run directory live in `mlxlaunch.runstate` (shared with
the launcher, which writes the records; the store only reads). Records are read `partial`, so
one from an older writer still counts. Writers also store the server's auth token; this view
never exposes it. A record whose pid is no longer alive is stale and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.runstate import RunState, pid_alive, run_dir, scan_records

__all__ = ["RunningServer", "pid_alive", "running_servers", "servers_using"]


@dataclass(frozen=True)
class RunningServer:
    """One live server as its state record describes it (without the token)."""

    pid: int
    url: str
    model: str
    model_path: Path | None
    started_at: float
    record: Path

    @classmethod
    def from_state(cls, state: RunState, record: Path) -> RunningServer:
        """The store's view of a parsed record; the token is left behind."""
        return cls(
            pid=state.pid,
            url=state.url,
            model=state.model,
            model_path=Path(state.model_path) if state.model_path else None,
            started_at=state.started_at,
            record=record,
        )


def running_servers(directory: Path | None = None) -> list[RunningServer]:
    """Live servers from the state records in `directory` (default: the run dir)."""
    scan = scan_records(directory or run_dir(), partial=True)
    return [RunningServer.from_state(state, path) for path, state in scan.live]


def servers_using(path: Path, directory: Path | None = None) -> list[RunningServer]:
    """Live servers whose loaded model directory is `path` or lies inside it."""
    target = path.resolve()
    users = []
    for server in running_servers(directory):
        if server.model_path is None:
            continue
        loaded = server.model_path.resolve()
        if loaded == target or target in loaded.parents:
            users.append(server)
    return users
