"""`mlx dash`: watch a running server live (Textual).

The dashboard itself (mlxlaunch.dash) only speaks HTTP; finding the server — the state files
that `mlx launch claude` and `mlx serve` write — happens here, at the top of the picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlxlaunch.dash.app import RETRY_S, DashApp, Locate
from mlxlaunch.dash.feed import ServerAddress
from mlxlaunch.launch.state import running_servers

DASH_HELP = """Watch a running server live: queue, speeds, prefix cache, recent requests.

Finds the newest server started by `mlx launch claude` or `mlx serve` on this machine, \
or watches the one at --url. Keeps retrying while no server answers.

Keys: p pause, c clear, tab / 1 / 2 switch panels, q quit.

Examples:

  mlx dash

  mlx dash --url http://127.0.0.1:8080 --token secret
"""


def server_locator(url: str | None, token: str | None, home: Path | None = None) -> Locate:
    """A callback that finds the server to watch, asked again on every connection attempt.

    With `url`, always that server (its token from `token`, else from a matching state
    file); without, the newest live state file, so a server started later is picked up.
    """

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
) -> None:
    DashApp(server_locator(url, token), retry_s=retry).run()
