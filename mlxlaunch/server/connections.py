"""Connection limits that an idle crowd cannot use to starve the clients being served.

`ConnectionRoster` decides who holds the server's connections; `BoundedConnection` is uvicorn's
h11 protocol reporting to it, with a deadline for each request head.

Design notes:

- Room is made, not refused. uvicorn's `limit_concurrency` counts every open connection and
  answers each request past it with a plain-text 503: 520 idle sockets (no token needed) made
  the server refuse everyone, `/health` included. Here a newcomer at capacity closes the
  connection that has been idle longest (no request in flight: its head still incomplete, or
  kept alive between requests); closing an idle connection is ordinary HTTP, and clients
  reconnect. Only when every connection is serving a request is the newcomer refused: it waits
  for its request head (at most `waiting_room` such connections; the oldest goes first) and
  gets a JSON 529 `overloaded_error` with `retry-after`, which the SDKs and Claude Code retry.
- Busy connections need a request that is being served. The request guard bounds how long
  its body may take (guards.py), and auth is checked before a body is read, so without a token
  a connection is busy only for the moment a 401 takes.
- Per peer: a remote address (IPv6: its /64, which one host is handed whole) holds at most
  `per_peer` connections; its newcomer displaces its own longest-idle connection, never
  anyone else's. Loopback peers have no per-peer cap: every local process shares 127.0.0.1,
  so the cap would be one global cap over local clients, and a local flooder would starve a
  local Claude Code as before. Local clients are protected by the eviction order instead (a
  connection with a request in flight is never closed to make room).
- A head deadline: h11 bounds the *size* of a request head (`h11_max_incomplete_event_size`),
  not the *time* it may take to arrive. A connection that has not delivered a complete head
  within `header_timeout_s` of connecting (or of the first byte of its next request: that byte
  cancels uvicorn's keep-alive timer, and nothing else would bound the wait) is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import resource
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from mlxlaunch.protocol.errors import error_body, status_for
from mlxlaunch.server.request_ids import REQUEST_ID_HEADER, new_request_id

log = logging.getLogger("mlxlaunch.server")

# File descriptors kept for everything but connections (weights, caches, logs, pipes).
FILE_HEADROOM = 128
# Warnings about a full server are logged at most this often (a flood must not flood the log).
_REPORT_EVERY_S = 10.0
OVERLOADED_MESSAGE = "server is at its connection limit: every connection is serving a request"


class Held(Protocol):
    """What the roster needs of a connection: whose it is, and how to close it."""

    @property
    def peer(self) -> str | None:
        """The per-peer cap's key (`peer_key`); None when no per-peer cap applies."""
        ...

    def drop(self) -> None:
        """Close the connection (the roster has already forgotten it)."""
        ...


def peer_key(host: str | None) -> str | None:
    """Whose connection this is, for the per-peer cap: None for loopback and unknown peers.

    An IPv4-mapped IPv6 address counts as its IPv4 address; other IPv6 addresses are grouped
    by their /64.
    """
    if not host:
        return None
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class ConnectionRoster:
    """Who holds the server's connections, and who gives way to a newcomer.

    Each connection is *idle* (no request in flight), *busy* (a request is being served) or
    *waiting* (it arrived when every connection was busy; its request is refused unless room
    has been made by the time its head arrives). Idle and busy connections are admitted and
    count against `capacity` and `per_peer`; waiting ones only against `waiting_room`.

    Args:
        capacity: most admitted connections.
        per_peer: most admitted connections of one remote peer (see `peer_key`).
        waiting_room: most waiting connections; default an eighth of `capacity`, at least 8.
        clock: seconds, for throttling the log (tests inject one).
    """

    def __init__(
        self,
        capacity: int,
        per_peer: int,
        *,
        waiting_room: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = max(1, capacity)
        self.per_peer = max(1, per_peer)
        self.waiting_room = waiting_room if waiting_room is not None else max(8, capacity // 8)
        self._clock = clock
        self._idle: OrderedDict[Held, None] = OrderedDict()  # longest idle first
        self._busy: set[Held] = set()
        self._waiting: OrderedDict[Held, None] = OrderedDict()  # oldest first
        self._peers: Counter[str] = Counter()  # admitted connections per capped peer
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # requests answered `overloaded_error`
        self._reported_at: float | None = None

    @property
    def admitted(self) -> int:
        return len(self._idle) + len(self._busy)

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def opened(self, conn: Held) -> None:
        """A new connection: admit it (closing an idle one if need be), or let it wait."""
        if self._make_room(conn):
            self._admit(conn)
            self._idle[conn] = None
            return
        self._waiting[conn] = None
        if len(self._waiting) > self.waiting_room:
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.drop()

    def request_started(self, conn: Held) -> bool:
        """A request head arrived on `conn`: whether it is served (False: refuse it)."""
        if conn in self._idle:
            del self._idle[conn]
            self._busy.add(conn)
            return True
        if conn in self._busy:
            return True
        if conn in self._waiting:
            del self._waiting[conn]
            if self._make_room(conn):
                self._admit(conn)
                self._busy.add(conn)
                return True
        self.refused += 1  # a waiting connection with no room, or one already closed
        self._report()
        return False

    def request_ended(self, conn: Held) -> None:
        """`conn` answered its request and is kept alive: now the most recently idle."""
        if conn in self._busy:
            self._busy.discard(conn)
            self._idle[conn] = None

    def closed(self, conn: Held) -> None:
        """`conn` is gone (any state; a second call is harmless)."""
        self._waiting.pop(conn, None)
        if conn in self._idle or conn in self._busy:
            self._idle.pop(conn, None)
            self._busy.discard(conn)
            if conn.peer is not None:
                self._peers[conn.peer] -= 1
                if self._peers[conn.peer] <= 0:
                    del self._peers[conn.peer]

    def _admit(self, conn: Held) -> None:
        if conn.peer is not None:
            self._peers[conn.peer] += 1

    def _make_room(self, conn: Held) -> bool:
        """Whether `conn` can be admitted, closing the idle connections that must give way."""
        if conn.peer is not None and self._peers[conn.peer] >= self.per_peer:
            # A scan, but a short one: this peer's idle connections are among the oldest.
            own = next((c for c in self._idle if c.peer == conn.peer), None)
            if own is None:
                return False
            self._evict(own)
        if self.admitted >= self.capacity:
            if not self._idle:
                return False
            self._evict(next(iter(self._idle)))
        return True

    def _evict(self, conn: Held) -> None:
        self.closed(conn)
        self.evicted += 1
        conn.drop()

    def _report(self) -> None:
        now = self._clock()
        if self._reported_at is not None and now - self._reported_at < _REPORT_EVERY_S:
            return
        self._reported_at = now
        log.warning(
            "connection limit reached: %d connections serving requests; %d idle ones closed "
            "to make room, %d requests refused so far",
            self.busy, self.evicted, self.refused,
        )  # fmt: skip


def overloaded_response() -> tuple[Message, Message]:
    """The ASGI messages of the answer to a request refused for want of a connection."""
    body = json.dumps(error_body("overloaded_error", OVERLOADED_MESSAGE)).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status_for("overloaded_error"),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"x-should-retry", b"true"),
            (REQUEST_ID_HEADER, new_request_id().encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


class BoundedConnection(H11Protocol):
    """uvicorn's h11 protocol, counted by a `ConnectionRoster`, with a head deadline."""

    header_timeout_s: float = 30.0
    roster: ConnectionRoster

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self.peer: str | None = None
        self._served = self.app
        self.app = self._serve_or_refuse
        self._counted: RequestResponseCycle | None = None  # the request the roster knows of
        self._refused = False

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = peer_key(self.client[0] if self.client else None)
        self.roster.opened(self)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self.roster.closed(self)
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a next request on a kept-alive connection start its deadline
        # (an idle kept-alive connection is uvicorn's keep-alive timer's business).
        if self._idle() and self._head_deadline is None:
            self._arm_head_deadline()
        super().data_received(data)

    # --- uvicorn's hooks -------------------------------------------------------------------

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not self._counted and not cycle.response_complete:
            # A request head arrived; its task starts after this returns, and reads the answer.
            self._counted = cycle
            self._refused = not self.roster.request_started(self)
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined next request
        if self._idle():
            self.roster.request_ended(self)

    # --- the roster's side -----------------------------------------------------------------

    def drop(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    async def _serve_or_refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._refused:
            for message in overloaded_response():
                await send(message)
            return
        await self._served(scope, receive, send)

    # --- the head deadline -----------------------------------------------------------------

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()


def connection_protocol(
    roster: ConnectionRoster, *, header_timeout_s: float
) -> type[BoundedConnection]:
    """A protocol class for `uvicorn.Config(http=...)`: one per server, sharing `roster`."""
    return type(
        "BoundedConnection",
        (BoundedConnection,),
        {"header_timeout_s": header_timeout_s, "roster": roster},
    )


def connection_capacity(wanted: int) -> int:
    """How many connections this process can hold: `wanted`, raising the soft limit on open
    files toward the hard one if need be (macOS starts processes at 256).

    A server out of file descriptors cannot accept the newcomer that would make room, so
    the capacity must stay below the limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FILE_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):  # else the capacity follows the limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    capacity = max(8, soft - FILE_HEADROOM)
    log.warning(
        "at most %d connections (not %d): the limit on open files is %d", capacity, wanted, soft
    )
    return capacity
