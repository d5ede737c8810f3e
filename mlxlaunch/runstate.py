"""The state record of a running server: its format, where records live, and which are live.

One JSON file per server process under `<home>/run/` (home: `mlxlaunch.home`), named
`<pid>.json` by the writer:

    {"pid": int, "url": str, "token": str, "model": str, "model_path": str,
     "log_file": str, "kind": "launch" | "serve", "started_at": float,
     "client": {"model_id": str, "small_model_id": str, "context_window": int,
                "max_output_tokens": int, "compact_at": int} | null}

`model` is the name the user gave (alias, repo id or path); `model_path` the resolved directory.
`client` is what clients are told about the served model (`ClientSettings`, derived once by
`launch.claude_env.client_settings` from the window the engine serves): `mlx launch claude
--print-env` reads it instead of guessing from config.json. Records from older writers lack it.
The token makes records secret: writers keep them 0600 inside a 0700 directory. A record whose
process is gone is stale. This module is top-level so both writers (`launch.state`) and
token-less readers (`store.running`, which must not import launch) share one parser and one
answer to "what is running" (`running_servers`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, cast

import psutil

from mlxlaunch.home import mlxlaunch_home

RunKind = Literal["launch", "serve"]
RUN_KINDS: tuple[RunKind, ...] = ("launch", "serve")

_T = TypeVar("_T")


def run_dir(home: Path | None = None) -> Path:
    """Directory holding one state record per running server."""
    return (home or mlxlaunch_home()) / "run"


def pid_alive(pid: int) -> bool:
    """True when a process with `pid` exists (another user's included; a zombie too)."""
    return pid > 0 and psutil.pid_exists(pid)


@dataclass(frozen=True)
class ClientSettings:
    """What a client is told about the served model; one record for every place that says it.

    `compact_at` is the prompt size at which Claude Code compacts, given this window and output
    budget (its own rule, see `launch.claude_env.compaction_threshold`): shown, never sent.
    """

    model_id: str  # the id clients send (never one Claude Code takes for a Claude model)
    small_model_id: str  # the id for Claude Code's background (haiku) tier
    context_window: int  # tokens, prompt and output together, as the engine serves them
    max_output_tokens: int  # the output budget clients are told
    compact_at: int  # prompt tokens at which Claude Code compacts

    @classmethod
    def from_json(cls, data: object) -> ClientSettings | None:
        """Parse a record's `client` object; None when absent (older writers).

        Raises:
            ValueError: present but malformed.
        """
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ValueError("bad state file content: 'client' is not an object")
        try:
            return cls(
                model_id=str(data["model_id"]),
                small_model_id=str(data["small_model_id"]),
                context_window=_to_int(data["context_window"]),
                max_output_tokens=_to_int(data["max_output_tokens"]),
                compact_at=_to_int(data["compact_at"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad state file content: 'client': {exc}") from exc


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
    client: ClientSettings | None = None  # None: an older writer's record

    @classmethod
    def from_json(cls, data: Mapping[str, object], *, partial: bool = False) -> RunState:
        """Parse a record's content; raises ValueError when a field is missing or wrong.

        `partial` readers need only `pid`: missing fields become empty, so a record from an
        older or foreign writer still counts as a live server (the store must not delete a
        model such a server has loaded). Everyone who talks to the server reads strictly.
        """
        if not isinstance(data, Mapping):
            raise ValueError("bad state file content: not an object")

        def get(key: str, convert: Callable[[object], _T], default: _T, needed: bool = False) -> _T:
            value = data.get(key)
            if partial and not needed and value is None:
                return default
            if key not in data:
                raise ValueError(f"bad state file content: missing {key!r}")
            try:
                return convert(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"bad state file content: {key!r}: {exc}") from exc

        kind = get("kind", str, "launch")
        if kind not in RUN_KINDS:
            if not partial:
                raise ValueError(f"unknown kind {kind!r}")
            kind = "launch"  # partial readers never look at the kind
        return cls(
            pid=get("pid", _to_int, 0, needed=True),
            url=get("url", str, ""),
            token=get("token", str, ""),
            model=get("model", str, ""),
            model_path=get("model_path", str, ""),
            log_file=get("log_file", str, ""),
            kind=cast(RunKind, kind),
            started_at=get("started_at", _to_float, 0.0),
            client=_client(data, partial),
        )


def _client(data: Mapping[str, object], partial: bool) -> ClientSettings | None:
    try:
        return ClientSettings.from_json(data.get("client"))
    except ValueError:
        if partial:
            return None  # partial readers never look at it
        raise


def _to_int(value: object) -> int:
    return int(value)  # type: ignore[call-overload]


def _to_float(value: object) -> float:
    return float(value)  # type: ignore[arg-type]


def read_record(path: Path, *, partial: bool = False) -> RunState | None:
    """Parse one record file; None when it is unreadable or malformed."""
    try:
        return RunState.from_json(json.loads(path.read_text(encoding="utf-8")), partial=partial)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunScan:
    """The records of a run directory, split into live servers and files to ignore."""

    live: list[tuple[Path, RunState]]
    dead: list[Path]  # stale (process gone) or malformed


def scan_records(directory: Path, *, partial: bool = False) -> RunScan:
    """Read every `*.json` record in `directory` (in name order) and check its process."""
    scan = RunScan(live=[], dead=[])
    if not directory.is_dir():
        return scan
    for path in sorted(directory.glob("*.json")):
        state = read_record(path, partial=partial)
        if state is not None and pid_alive(state.pid):
            scan.live.append((path, state))
        else:
            scan.dead.append(path)
    return scan


def running_servers(
    home: Path | None = None, *, prune: bool = True, partial: bool = False
) -> list[RunState]:
    """Live servers from the records under `home` (default: mlxlaunch's), newest first.

    `prune` deletes stale and malformed records. `partial` reads records that only name a
    pid (see `RunState.from_json`); such readers never talk to the server.
    """
    scan = scan_records(run_dir(home), partial=partial)
    if prune:
        for path in scan.dead:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted((state for _, state in scan.live), key=lambda s: s.started_at, reverse=True)
