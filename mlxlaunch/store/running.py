"""Which models running mlxlaunch servers have loaded, from their state records.

Record format (the launcher writes one file per running server, the store only reads):

    <MLXLAUNCH_HOME or platformdirs.user_cache_dir("mlxlaunch")>/run/<anything>.json
    {"pid": int, "url": str, "model": str, "model_path": str, "started_at": float}

`model` is the name the user gave (alias, repo id or path); `model_path` is the resolved
directory. Writers also store the server's auth token (for `mlx dash` and `--print-env`), kept
private by mode 0600 in a 0700 folder; this view never exposes it. A record whose pid is no
longer alive is stale and ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.store.paths import run_dir


@dataclass(frozen=True)
class RunningServer:
    """One live server as its state record describes it."""

    pid: int
    url: str
    model: str
    model_path: Path | None
    started_at: float
    record: Path


def pid_alive(pid: int) -> bool:
    """True when a process with `pid` exists (signal 0 probes without touching it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def _parse(record: Path) -> RunningServer | None:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    model_path = data.get("model_path")
    return RunningServer(
        pid=pid,
        url=str(data.get("url", "")),
        model=str(data.get("model", "")),
        model_path=Path(model_path) if model_path else None,
        started_at=float(data.get("started_at") or 0.0),
        record=record,
    )


def running_servers(directory: Path | None = None) -> list[RunningServer]:
    """Live servers from the state records in `directory` (default: the run dir)."""
    folder = directory or run_dir()
    if not folder.is_dir():
        return []
    found = (_parse(p) for p in sorted(folder.glob("*.json")))
    return [s for s in found if s is not None and pid_alive(s.pid)]


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
