"""Which models running mlxlaunch servers have loaded: a token-less view of their state records.

What is running is decided in one place, `mlxlaunch.runstate.running_servers` (shared with the
launcher, which writes the records, and `mlx ps`); the store only reads. Records are read
`partial`, so one from an older writer still counts, and never pruned here. Writers also store
the server's auth token; this view never exposes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxlaunch import runstate
from mlxlaunch.runstate import RunState, pid_alive

__all__ = ["RunningServer", "pid_alive", "running_servers", "servers_using"]


@dataclass(frozen=True)
class RunningServer:
    """One live server as its state record describes it (without the token)."""

    pid: int
    url: str
    model: str
    model_path: Path | None
    started_at: float

    @classmethod
    def from_state(cls, state: RunState) -> RunningServer:
        """The store's view of a parsed record; the token is left behind."""
        return cls(
            pid=state.pid,
            url=state.url,
            model=state.model,
            model_path=Path(state.model_path) if state.model_path else None,
            started_at=state.started_at,
        )


def running_servers(home: Path | None = None) -> list[RunningServer]:
    """Live servers (newest first) under `home` (default: mlxlaunch's), without their tokens."""
    states = runstate.running_servers(home, prune=False, partial=True)
    return [RunningServer.from_state(state) for state in states]


def servers_using(path: Path, home: Path | None = None) -> list[RunningServer]:
    """Live servers whose loaded model directory is `path` or lies inside it."""
    target = path.resolve()
    users = []
    for server in running_servers(home):
        if server.model_path is None:
            continue
        loaded = server.model_path.resolve()
        if loaded == target or target in loaded.parents:
            users.append(server)
    return users
