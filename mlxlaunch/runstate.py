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
Records are validated by pydantic (a `TypeAdapter` over the dataclasses below, with its lax
conversions: "8080" reads as 8080), so a malformed one is refused naming its field. The token
makes records secret: writers keep them 0600 inside a 0700 directory. A record whose
process is gone is stale. This module is top-level so both writers (`launch.state`) and
token-less readers (`store.running`, which must not import launch) share one parser and one
answer to "what is running" (`running_servers`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import psutil

from mlxlaunch.home import mlxlaunch_home

RunKind = Literal["launch", "serve"]
RUN_KINDS: tuple[RunKind, ...] = ("launch", "serve")

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError


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
        from pydantic import ValidationError

        if not isinstance(data, Mapping):
            raise ValueError("bad state file content: not an object")
        if partial:
            data = _partial_record(data)
        elif missing := [key for key in _REQUIRED if key not in data]:
            raise ValueError(f"bad state file content: missing {missing[0]!r}")
        try:
            return _validators()[0].validate_python(data)
        except ValidationError as exc:
            raise ValueError(f"bad state file content: {_first_error(exc)}") from exc


# Every key a strict reader needs: all of them but `client` (older writers have none).
_REQUIRED = tuple(f.name for f in fields(RunState) if f.name != "client")
# What a partial reader (the pid is all it needs) reads where a field is missing or null.
_PARTIAL_DEFAULTS: dict[str, object] = {
    "url": "",
    "token": "",
    "model": "",
    "model_path": "",
    "log_file": "",
    "kind": "launch",
    "started_at": 0.0,
    "client": None,
}


@functools.cache  # pydantic (~0.15 s to import) only for a command that reads records
def _validators() -> tuple[TypeAdapter[RunState], TypeAdapter[ClientSettings | None]]:
    """The record's validator, and its `client` object's."""
    from pydantic import TypeAdapter

    return TypeAdapter(RunState), TypeAdapter(ClientSettings | None)


def _partial_record(data: Mapping[str, object]) -> dict[str, object]:
    """`data` with its missing fields filled in; a kind or client it cannot read is left out,
    since partial readers never look at either."""
    from pydantic import ValidationError

    record = {**_PARTIAL_DEFAULTS, **{k: v for k, v in data.items() if v is not None}}
    if record["kind"] not in RUN_KINDS:
        record["kind"] = "launch"
    try:
        _validators()[1].validate_python(record["client"])
    except ValidationError:
        record["client"] = None
    return record


def _first_error(exc: ValidationError) -> str:
    """pydantic's first complaint, as `'field': what is wrong`."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where!r}: {error['msg']}" if where else error["msg"]


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
