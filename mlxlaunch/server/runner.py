"""Run the app under uvicorn in this process, on its own thread and event loop.

The engine keeps its own worker thread; this thread only does HTTP. The socket is bound here,
before uvicorn starts, so port 0 yields the real port at once and a bind error is raised to the
caller instead of being logged on a background thread. Stopping drains (server/drain.py):
requests in flight get a bounded time to finish, then an `overloaded_error`; uvicorn's own
cancel of what is left, which prints tracebacks, is only the backstop behind it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass

import anyio
import uvicorn

from mlxlaunch.errors import ConfigError
from mlxlaunch.server.app import build_app
from mlxlaunch.server.connections import (
    ConnectionRoster,
    connection_capacity,
    connection_protocol,
)
from mlxlaunch.server.drain import Drain
from mlxlaunch.server.guards import check_exposure
from mlxlaunch.server.settings import ServerSettings, ServingEngine
from mlxlaunch.server.stats_routes import close_streams

_START_TIMEOUT_S = 30.0
# How long requests in flight may finish by default when the server stops.
DEFAULT_DRAIN_S = 5.0
# After the drain: time for the cut requests' last bytes and uvicorn's own shutdown.
_STOP_GRACE_S = 5.0


@dataclass
class ServerHandle:
    """A running server. `stop()` shuts it down cleanly and frees the port."""

    host: str
    port: int
    _server: uvicorn.Server
    _thread: threading.Thread
    _socket: socket.socket
    _engine: object
    _drain: Drain
    connections: ConnectionRoster  # who holds the connections (server/connections.py)

    @property
    def url(self) -> str:
        """The base URL clients use (no `/v1`), e.g. `http://127.0.0.1:8080`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Requests being served now."""
        return self._drain.in_flight

    def stop(self, timeout: float = DEFAULT_DRAIN_S) -> None:
        """Stop accepting; requests in flight get `timeout` s to finish, then an error answer.

        A KeyboardInterrupt while waiting (a second Ctrl-C) ends the drain at once; the
        requests still get their error answer.
        """
        close_streams(self._engine)  # endless stats streams would hold up a graceful stop
        self._drain.begin(timeout)
        # uvicorn cancels what is left after its own timeout: keep that behind ours.
        self._server.config.timeout_graceful_shutdown = round(timeout + _STOP_GRACE_S)
        self._server.should_exit = True
        deadline = time.monotonic() + timeout + 2 * _STOP_GRACE_S
        while self._thread.is_alive() and (left := deadline - time.monotonic()) > 0:
            try:
                self._thread.join(left)
            except KeyboardInterrupt:
                self._drain.end_now()
                deadline = min(deadline, time.monotonic() + _STOP_GRACE_S)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(_STOP_GRACE_S)
        self._socket.close()

    def cut_off(self, message: str) -> None:
        """End every request in flight now with `message` (an `error` answer or event), and
        answer new ones the same: the engine behind the server can answer nothing more."""
        self._drain.end_now(message)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); raises ConfigError when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # The protocol must be named: asyncio turns Nagle's algorithm off only on connections whose
    # socket says IPPROTO_TCP, and accepted sockets copy the listener's (0 when left out). With
    # Nagle on, each small SSE event after the headers waited for the client's delayed ACK on
    # a kept-alive connection: ~40 ms before the first token reached the client.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port, or 0 for any free port",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def _open_task_group() -> None:
    async with anyio.create_task_group():
        pass


def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    """The HTTP thread. Starlette streams a response inside an anyio task group, and anyio
    imports its asyncio backend the first time one opens: ~40 ms that the first streamed
    response (a fresh `mlx launch claude`'s first answer) waited for. Done here, before the
    server reports itself started."""
    asyncio.run(_open_task_group())
    server.run(sockets=[sock])


def start_server(
    engine: ServingEngine, settings: ServerSettings | None = None, *, log_level: str = "warning"
) -> ServerHandle:
    """Serve `engine` on `settings.host:settings.port` from a background thread."""
    settings = settings or ServerSettings()
    check_exposure(
        settings.host, auth_token=settings.auth_token, allow_remote=settings.allow_remote
    )
    limits = settings.limits
    # Connections are admitted by the roster (server/connections.py), not by uvicorn's
    # `limit_concurrency`, which answered everyone a plain 503 once idle sockets filled it.
    roster = ConnectionRoster(
        connection_capacity(limits.max_connections), limits.max_connections_per_peer
    )
    sock = bind_socket(settings.host, settings.port)
    drain = Drain(build_app(engine, settings))
    config = uvicorn.Config(
        drain,
        lifespan="off",
        log_config=None,  # keep the host application's logging setup
        log_level=log_level,
        access_log=False,  # the app logs one line per request itself
        timeout_graceful_shutdown=round(DEFAULT_DRAIN_S + _STOP_GRACE_S),  # set again by stop()
        # `ping` frames keep streams alive; idle keep-alive connections may linger a while.
        timeout_keep_alive=75,
        # Bounds on what a client can hold (server/guards.py has the per-request ones).
        http=connection_protocol(roster, header_timeout_s=limits.header_timeout_s),
        ws="none",  # no WebSocket routes: an upgrade would leave the roster's protocol
        h11_max_incomplete_event_size=limits.max_header_bytes,
        server_header=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=_serve, args=(server, sock), name="mlxlaunch-http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    return ServerHandle(
        host=str(host),
        port=int(port),
        _server=server,
        _thread=thread,
        _socket=sock,
        _engine=engine,
        _drain=drain,
        connections=roster,
    )
