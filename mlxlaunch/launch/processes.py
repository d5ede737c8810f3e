"""Running servers as processes: their memory and start time, which one a user means, stopping.

Facts come from psutil (the same on Linux and macOS). A record whose pid now belongs
to a process that started after the record was written is stale (the pid was reused), so
`mlx stop` never signals a stranger. Stopping is SIGTERM, then a bounded wait: `mlx serve` and
`mlx launch` drain and remove their own records on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch.state import remove_state
from mlxlaunch.runstate import RunState, running_servers

# A record is written a moment after its process starts; allow for clock granularity.
START_SLACK_S = 5.0
# `mlx serve` drains for up to 5 s, `mlx launch` gives claude 5 s and drains for 2 s.
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class ProcessFacts:
    """What the OS says about one live process."""

    rss_bytes: int | None
    started_at: float | None  # seconds since the epoch
    zombie: bool  # exited, not yet reaped by its parent


def process_facts(pid: int) -> ProcessFacts | None:
    """RSS, start time and zombie state of `pid`; None when there is no such process."""
    if pid <= 0:
        return None
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            zombie = process.status() == psutil.STATUS_ZOMBIE
            started = process.create_time()
            try:
                rss: int | None = process.memory_info().rss
            except (psutil.AccessDenied, psutil.ZombieProcess):
                rss = None  # another user's process (macOS), or one that has exited
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:  # alive, but the OS tells us nothing more about it
        return ProcessFacts(rss_bytes=None, started_at=None, zombie=False)
    return ProcessFacts(rss_bytes=rss, started_at=started, zombie=zombie)


Facts = Callable[[int], ProcessFacts | None]


def is_running(state: RunState, facts: Facts = process_facts) -> bool:
    """True when the record's process is alive, not a zombie, and not a later process that
    was given the same pid."""
    found = facts(state.pid)
    if found is None or found.zombie:
        return False
    reused = (
        found.started_at is not None
        and state.started_at > 0
        and found.started_at > state.started_at + START_SLACK_S
    )
    return not reused


def live_servers(home: Path | None = None, *, facts: Facts = process_facts) -> list[RunState]:
    """`running_servers` (newest first) less the records whose pid is a zombie or now belongs
    to another process; those records are deleted, as dead ones are."""
    live = []
    for state in running_servers(home, partial=True):
        if is_running(state, facts):
            live.append(state)
        else:
            remove_state(state.pid, home)
    return live


class ServerNotFound(MlxLaunchError):
    """No running server matches what the user named."""


class WhichServer(MlxLaunchError):
    """Several servers match and the user did not say which (or --all)."""

    exit_code = 2

    def __init__(self, message: str, servers: Sequence[RunState], *, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.servers = list(servers)


def model_label(model: str) -> str:
    """A record's model as a user would name it: an alias or repo id as given, a path's last
    part (paths are long, and their end is what tells models apart)."""
    if model.startswith(("/", "~", ".")):
        return Path(model).name or model
    return model


def _matches(state: RunState, target: str) -> bool:
    if target.isdigit():
        return state.pid == int(target)
    wanted = target.rstrip("/")
    return wanted in (state.model.rstrip("/"), model_label(state.model), state.url.rstrip("/"))


def select_servers(
    servers: Sequence[RunState], target: str | None = None, *, every: bool = False
) -> list[RunState]:
    """The servers `mlx stop [TARGET] [--all]` means: all, those matching a pid, model or URL,
    or the only one running.

    Raises:
        ServerNotFound: nothing runs, or nothing matches `target`.
        WhichServer: more than one matches and `every` is not set; it carries the candidates.
    """
    if not servers:
        raise ServerNotFound("no mlx server is running", hint="see `mlx ps`")
    chosen = [s for s in servers if target is None or _matches(s, target)]
    if not chosen:
        raise ServerNotFound(f"no running server matches {target!r}", hint="see `mlx ps`")
    if len(chosen) > 1 and not every:
        what = f"match {target!r}" if target else "are running"
        raise WhichServer(
            f"{len(chosen)} servers {what}",
            chosen,
            hint="name one: mlx stop PID (pids in `mlx ps`), or stop them all: mlx stop --all",
        )
    return chosen


@dataclass(frozen=True)
class StopOutcome:
    """How one stop went."""

    server: RunState
    stopped: bool
    waited_s: float


def stop_server(
    state: RunState,
    *,
    timeout_s: float = STOP_TIMEOUT_S,
    facts: Facts = process_facts,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StopOutcome:
    """Send SIGTERM to the server's process and wait up to `timeout_s` for it to exit.

    A process that is already gone (or is not the record's any more) counts as stopped and
    is not signalled. Raises PermissionError when the process belongs to another user.
    """
    start = clock()
    if not is_running(state, facts):
        return StopOutcome(state, True, 0.0)
    try:
        os.kill(state.pid, signal.SIGTERM)
    except ProcessLookupError:
        return StopOutcome(state, True, 0.0)
    while clock() - start < timeout_s:
        if not is_running(state, facts):
            return StopOutcome(state, True, clock() - start)
        sleep(0.05)
    return StopOutcome(state, not is_running(state, facts), clock() - start)
