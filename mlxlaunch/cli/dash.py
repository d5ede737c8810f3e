"""`mlx dash`: watch a running server live (Textual), or print one snapshot of it.

The dashboard itself (mlxlaunch.dash) only speaks HTTP; finding the server — the state files
that `mlx launch claude` and `mlx serve` write — happens here, at the top of the picture.
Textual and the HTTP client are imported when the command runs, not with `mlx --help`.
Without a terminal (a pipe, a log, CI) a live screen would be escape codes without end, so
`mlx dash` prints one snapshot and exits, as `--once` does on a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlxlaunch.cli.consoles import stdout_console
from mlxlaunch.dash import RETRY_S
from mlxlaunch.errors import MlxLaunchError

if TYPE_CHECKING:
    from mlxlaunch.dash.feed import ServerAddress

DASH_HELP = """Watch a running server live: queue, speeds, prefix cache, recent requests.

Finds the newest server started by `mlx launch claude` or `mlx serve` on this machine, \
or watches the one at --url. Keeps retrying while no server answers.

Keys: p pause, c clear, tab / 1 / 2 switch panels, q quit.

Without a terminal (or with --once) it prints one snapshot and exits: exit 1 when no \
server answers.

Examples:

  mlx dash

  mlx dash --url http://127.0.0.1:8080 --token secret

  mlx dash --once >> stats.log
"""

NO_SERVER_HINT = "start one with `mlx launch claude` or `mlx serve`, or pass --url"


def server_locator(
    url: str | None, token: str | None, home: Path | None = None
) -> Callable[[], ServerAddress | None]:
    """A callback that finds the server to watch, asked again on every connection attempt.

    With `url`, always that server (its token from `token`, else from a matching state
    file); without, the newest live state file, so a server started later is picked up.
    """
    from mlxlaunch.dash.feed import ServerAddress
    from mlxlaunch.launch.state import running_servers

    def locate() -> ServerAddress | None:
        servers = running_servers(home, prune=False)
        if url is not None:
            wanted = url.rstrip("/")
            known = next((s.token for s in servers if s.url.rstrip("/") == wanted), None)
            return ServerAddress(wanted, token or known)
        if not servers:
            return None
        newest = servers[0]
        return ServerAddress(newest.url, token or newest.token)

    return locate


def print_snapshot(locate: Callable[[], ServerAddress | None]) -> None:
    """One snapshot of the server `locate` finds, as text (exit 1 when none answers)."""
    import asyncio

    from mlxlaunch.dash.feed import ServerUnreachable, StatsFeed
    from mlxlaunch.dash.panels import snapshot_text

    address = locate()
    if address is None:
        raise MlxLaunchError("no running server found", hint=NO_SERVER_HINT)
    try:
        snapshot = asyncio.run(StatsFeed(address).fetch())
    except ServerUnreachable as exc:
        raise MlxLaunchError(f"{address.url}: {exc}", hint=NO_SERVER_HINT) from exc
    stdout_console().print(snapshot_text(snapshot, address.url), highlight=False)


def dash(
    url: Annotated[
        str | None,
        typer.Option(help="The server's base URL (default: find the running one)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="MLX_AUTH_TOKEN",
            help="The server's token (default: from its state file).",
            show_default=False,
        ),
    ] = None,
    retry: Annotated[
        float, typer.Option(min=0.2, help="Seconds between attempts to reach the server.")
    ] = RETRY_S,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one snapshot and exit (default without a terminal)."),
    ] = False,
) -> None:
    locate = server_locator(url, token)
    if once or not sys.stdout.isatty():
        print_snapshot(locate)
        return
    from mlxlaunch.dash.app import DashApp

    DashApp(locate, retry_s=retry).run()
