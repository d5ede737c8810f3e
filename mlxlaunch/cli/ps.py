"""`mlx ps` and `mlx stop`: the servers running on this machine, and stopping them.

Which servers run, their memory and their uptime come from `mlxlaunch.launch.processes` (the
state records plus what the OS says about each pid). Requests in flight are asked of each
server over HTTP (`GET /v1/stats`, the snapshot `mlx dash` reads), with a short timeout: a
busy or wedged server still shows up, with its request count unknown.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from mlxlaunch.cli.consoles import stderr_console, stdout_console
from mlxlaunch.cli.layout import Column, Record, print_report
from mlxlaunch.cli.options import JsonOption
from mlxlaunch.dash.snapshot import human_duration
from mlxlaunch.launch.processes import (
    STOP_TIMEOUT_S,
    ProcessFacts,
    ServerNotFound,
    WhichServer,
    live_servers,
    model_label,
    process_facts,
    select_servers,
    stop_server,
)
from mlxlaunch.runstate import RunState
from mlxlaunch.store.memory import format_bytes

if TYPE_CHECKING:
    from mlxlaunch.protocol.stats import StatsSnapshot

# Long enough for an idle server on a loaded laptop, short enough that `mlx ps` feels instant.
STATS_TIMEOUT_S = 0.5

PS_HELP = """List the mlx servers running on this machine (`mlx serve`, `mlx launch`).

For each: pid, kind, model (and any served beside it, e.g. a small model for Claude Code's \
haiku tier), address, resident memory, requests the server is working on \
(running+queued, when it answers within half a second) and uptime. Records left by servers \
that are gone are removed.

Examples:

  mlx ps

  mlx ps --json | jq -r '.[].url'
"""

STOP_HELP = f"""Stop a running mlx server: SIGTERM, then wait for it to exit.

With no argument and one server running, stops that one; with several, asks which (or, \
without a terminal, lists them). TARGET is a pid, a model or a URL from `mlx ps`. A stopped \
`mlx launch` ends the agent session running on it too: on a terminal that is asked first \
(--yes does not ask), and both sides say so. Waits up to --timeout seconds \
(default {STOP_TIMEOUT_S:.0f}).

Examples:

  mlx stop

  mlx stop 41235

  mlx stop qwen-coder-7b

  mlx stop --all
"""

_err = stderr_console()

Stats = Callable[[RunState], "StatsSnapshot | None"]


@dataclass(frozen=True)
class ServerRow:
    """One line of `mlx ps` (and one object of `mlx ps --json`); never the token."""

    pid: int
    kind: str
    model: str
    model_path: str
    url: str
    rss_bytes: int | None
    started_at: float
    uptime_s: float
    requests_running: int | None
    requests_queued: int | None
    log_file: str
    # Several models in one server: each one after the main model, with its role and state.
    also: tuple[ServedAlso, ...] = ()


@dataclass(frozen=True)
class ServedAlso:
    """A model served beside the main one (`--small-model`, more `--model`)."""

    name: str
    role: str  # "small" (Claude Code's haiku tier) or "extra"
    state: str  # "loaded", "loading", "unloaded" (keep-alive) or "failed"
    failure: str | None = None  # why it could not be loaded

    @property
    def label(self) -> str:
        """How the model column names it, e.g. `qwen3-4b (haiku)`."""
        role = "haiku" if self.role == "small" else self.role
        note = "failed" if self.failure else ("" if self.state == "loaded" else self.state)
        return f"{self.name} ({role}{': ' + note if note else ''})"


def _also(snapshot: StatsSnapshot | None) -> tuple[ServedAlso, ...]:
    if snapshot is None:
        return ()
    return tuple(
        ServedAlso(
            name=m.model.name or "?",
            role=m.role,
            state="failed" if m.failure else m.model.state,
            failure=m.failure,
        )
        for m in snapshot.models[1:]
    )


def fetch_stats(state: RunState, timeout: float = STATS_TIMEOUT_S) -> StatsSnapshot | None:
    """The server's stats snapshot, or None when it does not answer in time (or at all)."""
    import httpx
    from pydantic import ValidationError

    from mlxlaunch.protocol.stats import StatsSnapshot

    if not state.url:
        return None
    headers = {"authorization": f"Bearer {state.token}"} if state.token else {}
    try:
        response = httpx.get(state.url + "/v1/stats", headers=headers, timeout=timeout)
        if response.status_code != 200:
            return None
        return StatsSnapshot.model_validate_json(response.content)
    except (httpx.HTTPError, ValidationError):
        return None


def server_rows(
    servers: Sequence[RunState],
    *,
    facts: Callable[[int], ProcessFacts | None] = process_facts,
    stats: Stats = fetch_stats,
    now: float | None = None,
) -> list[ServerRow]:
    """What `mlx ps` shows about `servers`."""
    now = time.time() if now is None else now
    rows = []
    for state in servers:
        found = facts(state.pid)
        snapshot = stats(state)
        rows.append(
            ServerRow(
                pid=state.pid,
                kind=state.kind,
                model=state.model,
                model_path=state.model_path,
                url=state.url,
                rss_bytes=found.rss_bytes if found else None,
                started_at=state.started_at,
                uptime_s=max(0.0, now - state.started_at) if state.started_at else 0.0,
                requests_running=snapshot.running if snapshot else None,
                requests_queued=snapshot.queue_depth if snapshot else None,
                log_file=state.log_file,
                also=_also(snapshot),
            )
        )
    return rows


COLUMNS = (
    Column("pid", justify="right"),
    Column("kind"),
    Column("model"),
    Column("address"),
    Column("memory", justify="right"),
    Column("reqs", justify="right"),
    Column("up", justify="right"),
)


def _memory(row: ServerRow) -> str:
    return format_bytes(row.rss_bytes) if row.rss_bytes is not None else "?"


def _requests(row: ServerRow) -> str:
    if row.requests_running is None or row.requests_queued is None:
        return "?"
    waiting = f"+{row.requests_queued}" if row.requests_queued else ""
    return f"{row.requests_running}{waiting}"


def _address(url: str) -> str:
    # The scheme is always http: leaving it out keeps the table inside 80 columns.
    return url.removeprefix("http://")


def _model(row: ServerRow) -> str:
    return " + ".join([model_label(row.model), *(m.label for m in row.also)])


def _cells(row: ServerRow) -> list[str]:
    model, up = _model(row), human_duration(row.uptime_s)
    return [str(row.pid), row.kind, model, _address(row.url), _memory(row), _requests(row), up]


def _record(row: ServerRow) -> Record:
    heading = Text(f"{row.pid} ", style="bold")
    heading.append(f"{row.kind} {_model(row)}")
    failures = tuple((f"{m.name}", m.failure) for m in row.also if m.failure)
    fields = (
        *failures,
        ("url", row.url),
        ("memory", _memory(row)),
        ("requests", _requests(row)),
        ("up", human_duration(row.uptime_s)),
    )
    return Record(heading, fields)


def print_servers(console: Console, rows: Sequence[ServerRow]) -> None:
    """The rows as a table when it fits `console`, else a block per server."""
    print_report(console, COLUMNS, [_cells(r) for r in rows], [_record(r) for r in rows])


def rows_json(rows: Sequence[ServerRow]) -> list[dict[str, Any]]:
    """`mlx ps --json`: one object per server."""
    return [asdict(row) for row in rows]


def ps(as_json: JsonOption = False) -> None:
    """List the running mlx servers (help: PS_HELP)."""
    rows = server_rows(live_servers())
    if as_json:
        typer.echo(json.dumps(rows_json(rows), indent=2))
        return
    if not rows:
        _err.print("no mlx servers running (start one: mlx launch claude, or mlx serve)")
        return
    print_servers(stdout_console(), rows)


def _choose(ambiguous: WhichServer) -> list[RunState]:
    """Ask which of several servers to stop (on a terminal); re-raise without one."""
    if not sys.stdin.isatty():
        raise ambiguous
    print_servers(_err, server_rows(ambiguous.servers))
    if any(s.kind == "launch" for s in ambiguous.servers):
        _err.print("stopping a launch ends the agent session running on it", highlight=False)
    pids = {str(s.pid): s for s in ambiguous.servers}
    answer = typer.prompt("pid to stop (or `all`)", err=True).strip()
    if answer == "all":
        return ambiguous.servers
    if answer not in pids:
        raise ServerNotFound(f"{answer!r} is not one of the pids listed", hint="see `mlx ps`")
    return [pids[answer]]


def stop(
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="TARGET", help="A pid, model or URL from `mlx ps`.", show_default=False
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Stop every running server.")] = False,
    timeout: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for each server to exit.")
    ] = STOP_TIMEOUT_S,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Stop a launch without asking on a terminal.")
    ] = False,
) -> None:
    """Stop running mlx servers (help: STOP_HELP)."""
    servers = live_servers()
    try:
        chosen = select_servers(servers, target, every=every)
    except WhichServer as ambiguous:
        chosen = _choose(ambiguous)  # the list said what stopping a launch does
    else:
        chosen = _sessions_agreed(chosen, ask=not yes and sys.stdin.isatty())
    failed = 0
    for state in chosen:
        label = f"{state.pid} ({state.kind}, {model_label(state.model)})"
        try:
            outcome = stop_server(state, timeout_s=timeout)
        except PermissionError:
            _err.print(f"[red]not allowed[/] to signal {label}: it belongs to another user")
            failed += 1
            continue
        if outcome.stopped:
            ended = "; the agent session on it has ended" if state.kind == "launch" else ""
            _err.print(f"stopped {label} in {outcome.waited_s:.1f}s{ended}", highlight=False)
        else:
            _err.print(
                f"[yellow]still running[/] after {timeout:.0f}s: {label}; "
                f"force it with: kill -9 {state.pid}",
                highlight=False,
            )
            failed += 1
    if failed:
        raise typer.Exit(1)


def _sessions_agreed(chosen: list[RunState], *, ask: bool) -> list[RunState]:
    """`chosen`, less the launches the user would rather keep: stopping one ends the agent
    session on it (the user's Claude Code, say). Asked only when `ask` (a terminal, no
    --yes); No by default, as a stray Enter must not end someone's session."""
    launches = [s for s in chosen if s.kind == "launch"]
    if not launches or not ask:
        return chosen
    names = ", ".join(f"{s.pid} ({model_label(s.model)})" for s in launches)
    it = "it" if len(launches) == 1 else "each"
    question = f"mlx launch {names}: stopping ends the agent session running on {it}. Stop?"
    if typer.confirm(question, default=False, err=True):
        return chosen
    _err.print(f"left running: {names}", highlight=False)
    return [s for s in chosen if s.kind != "launch"]
