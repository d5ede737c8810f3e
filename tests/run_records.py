"""State records of running servers (`mlxlaunch.runstate`) for tests: plausible values, changed
where a test cares."""

from __future__ import annotations

from typing import Any

from mlxlaunch.runstate import RunState


def run_record(pid: int, **changes: Any) -> RunState:
    """A record of an `mlx launch` with process `pid`; `changes` set other fields."""
    fields: dict[str, Any] = {
        "pid": pid,
        "url": "http://127.0.0.1:1234",
        "token": "tok",
        "model": "demo",
        "model_path": "/m",
        "log_file": "/l.log",
        "kind": "launch",
        "started_at": 1.0,
    }
    return RunState(**{**fields, **changes})
