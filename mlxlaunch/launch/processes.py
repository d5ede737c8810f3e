"""Running servers as processes: their memory and start time, which one a user means, stopping.

Facts come from /proc on Linux and from `ps` elsewhere (macOS). A record whose pid now belongs
to a process that started after the record was written is stale (the pid was reused), so
`mlx stop` never signals a stranger. Stopping is SIGTERM, then a bounded wait: `mlx serve` and
`mlx launch` drain and remove their own records on SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch.state import remove_state
from mlxlaunch.runstate import RunState, pid_alive, running_servers

# A record is written a moment after its process starts; allow for clock granularity.
START_SLACK_S = 5.0
# `mlx serve` drains for up to 5 s, `mlx launch` gives claude 5 s and drains for 2 s.
STOP_TIMEOUT_S = 20.0

_PROC = Path("/proc")
_ELAPSED = re.compile(r"^(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+)$")


@dataclass(frozen=True)
class ProcessFacts:
    """What the OS says about one live process."""

    rss_bytes: int | None
    started_at: float | None  # seconds since the epoch
    zombie: bool  # exited, not yet reaped by its parent


def _proc_facts(pid: int, proc: Path) -> ProcessFacts | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
        boot = (proc / "stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name: state is field 3, start time field 22.
    fields = stat.rsplit(")", 1)[1].split()
    rss = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.MULTILINE)
    btime = re.search(r"^btime\s+(\d+)", boot, re.MULTILINE)
    started = None
    if btime is not None:
        started = int(btime.group(1)) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return ProcessFacts(
        rss_bytes=int(rss.group(1)) * 1024 if rss else None,
        started_at=started,
        zombie=fields[0] == "Z",
    )


def parse_elapsed(text: str) -> float | None:
    """`ps -o etime` ("[[dd-]hh:]mm:ss") in seconds; None when it is not that."""
    match = _ELAPSED.match(text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _ps_facts(pid: int, now: float) -> ProcessFacts | None:
    try:
        done = subprocess.run(
            ["ps", "-o", "rss=,stat=,etime=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) < 3:
        return None
    elapsed = parse_elapsed(parts[2])
    return ProcessFacts(
        rss_bytes=int(parts[0]) * 1024 if parts[0].isdigit() else None,
        started_at=now - elapsed if elapsed is not None else None,
        zombie=parts[1].startswith("Z"),
    )


def process_facts(pid: int, *, proc: Path = _PROC, now: float | None = None) -> ProcessFacts | None:
    """RSS, start time and zombie state of `pid`; None when there is no such process."""
    if not pid_alive(pid):
        return None
    if (proc / "self" / "stat").exists():
        return _proc_facts(pid, proc)
    return _ps_facts(pid, time.time() if now is None else now)


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
