"""The server's outer wall: who may reach it and how much they may send.

A model server on localhost is reachable by every web page the user opens (through DNS
rebinding or a plain cross-origin POST) and by every local process. `RequestGuard` is ASGI
middleware that runs before routing and auth:

- Host check: the `Host` header must name a loopback address, `localhost`, or the configured
  host, so a page on `attacker.example` that rebinds its name to 127.0.0.1 gets 403.
- Origin check: browsers send `Origin` on cross-origin requests; any Origin not on the
  allow-list (empty by default) gets 403, and no CORS headers are sent unless allowed. Claude
  Code, the SDKs and `mlx dash` are not browsers and send no Origin.
- Size and time: header count, a body limit counted as bytes arrive (a declared
  Content-Length over it is refused before any body is read), a deadline for each piece
  of a slow upload, and a minimum average rate for the whole body: a piece every 20 s beat
  the per-piece deadline forever, holding a connection the connection roster may not close
  (connections.py: one with a request in flight is never closed to make room).

`check_exposure` refuses to listen beyond loopback unless asked to, and never without a token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxlaunch.errors import ConfigError
from mlxlaunch.loopback import is_loopback
from mlxlaunch.protocol.errors import ErrorType, error_body
from mlxlaunch.protocol.limits import MAX_BODY_BYTES

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_CORS_METHODS = "GET, POST, HEAD, OPTIONS"


@dataclass(frozen=True)
class HttpLimits:
    """Connection and request limits (defaults suit a local server; tests shrink the timeouts).

    Args:
        max_body_bytes: largest request body (the Anthropic API's own 32 MiB); 413 beyond it.
        max_headers: most header lines in one request; 431 beyond it.
        max_header_bytes: largest request head (431 beyond it; a head still incomplete past
            it is refused by uvicorn's parser with a plain 400).
        header_timeout_s: longest time from connecting to a complete request head.
        body_timeout_s: longest wait for the next piece of a request body; 408 after it.
        min_body_rate: bytes per second a body must average once `body_timeout_s` has
            passed: byte n is due `body_timeout_s + n / min_body_rate` after the head; 408
            after it (0: no such deadline). The default, 256 KiB/s, lets a 32 MiB body take
            over two minutes; over loopback one arrives in a fraction of a second.
        max_connections: most open connections; at it, a newcomer closes the longest-idle
            one, and is answered 529 only when every connection is serving a request
            (server/connections.py). The engine's own admission answers 429 long before.
        max_connections_per_peer: most open connections of one remote address (IPv6: one
            /64); loopback clients, who all share 127.0.0.1, are not held to it.
    """

    max_body_bytes: int = MAX_BODY_BYTES
    max_headers: int = 100
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    min_body_rate: float = 256 * 1024
    max_connections: int = 512
    max_connections_per_peer: int = 64


# --- exposure ------------------------------------------------------------------------------


def check_exposure(host: str, *, auth_token: str | None, allow_remote: bool) -> None:
    """Refuse (ConfigError, with the reason) to listen beyond loopback unless explicitly
    allowed, and never beyond loopback without a token."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"refusing to listen on {host}: the server only listens on this machine "
            "(127.0.0.1) unless told otherwise, because anyone who can reach it can run the "
            "model and read what it is sent",
            hint="add --allow-remote to serve other machines (a token is then required), "
            "or use --host 127.0.0.1",
        )
    if not auth_token:
        raise ConfigError(
            f"refusing to listen on {host} without authentication",
            hint="drop --no-auth (a random token is made and printed) or pass --auth-token",
        )


# --- host and origin policies ----------------------------------------------------------------


def host_name(header: str) -> str | None:
    """The host part of a `Host` header (`[::1]:8080` → `::1`); None when malformed."""
    value = header.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
    elif value.count(":") == 1:
        name, port = value.split(":")
        if not port.isdigit():
            return None
    else:
        name = value  # no port, or a bare IPv6 address
    name = name.rstrip(".").lower()
    return name or None


def _local_names() -> set[str]:
    names = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.update({name.lower(), f"{name.lower().split('.')[0]}.local"})
    return names


class HostPolicy:
    """Which `Host` headers this server answers.

    Always: `localhost` and loopback addresses (any port). Also the configured host. When
    bound to all interfaces, also any IP address literal and this machine's own names: an
    attacker's DNS name never qualifies, which is what defeats DNS rebinding.
    """

    def __init__(self, bind_host: str, extra_names: Iterable[str] = ()) -> None:
        self.any_address = bind_host.strip("[]") in WILDCARD_HOSTS
        self.names = {"localhost", *(n.lower() for n in extra_names)}
        bound = bind_host.strip().strip("[]").rstrip(".").lower()
        if bound and not self.any_address:
            self.names.add(bound)
        if self.any_address:
            self.names |= _local_names()

    def allows(self, header: str | None) -> bool:
        """Whether a request with this `Host` header value may proceed."""
        name = host_name(header) if header else None
        if name is None:
            return False
        if name in self.names or is_loopback(name):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return self.any_address


def normalise_origin(origin: str) -> str:
    """`HTTPS://App.Example:8443/` → `https://app.example:8443` (how browsers send it)."""
    return origin.strip().rstrip("/").lower()


def check_origin_spec(origin: str) -> str:
    """Validate an --allow-origin value (`scheme://host[:port]`); returns it normalised."""
    value = normalise_origin(origin)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
        raise ConfigError(
            f"bad origin {origin!r}",
            hint="an origin is scheme://host[:port], e.g. http://localhost:3000",
        )
    return value


# --- the middleware ------------------------------------------------------------------------


def _refusal(error_type: ErrorType, message: str, status: int) -> tuple[Message, Message]:
    body = json.dumps(error_body(error_type, message)).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # The rest of the request is never read: the connection cannot be reused.
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


class _Refused(Exception):
    """Raised inside the guard to answer with an envelope instead of calling the app."""

    def __init__(self, error_type: ErrorType, message: str, status: int) -> None:
        super().__init__(message)
        self.response = _refusal(error_type, message, status)


class _BodyWatch:
    """Counts request-body bytes as they arrive; turns overruns and stalls into a refusal.

    When the body breaks a limit, the app is told the client disconnected (so it stops
    reading), its own answer is dropped, and the guard sends the refusal instead.
    """

    def __init__(
        self,
        receive: Receive,
        send: Send,
        limits: HttpLimits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._receive = receive
        self._send = send
        self._limits = limits
        self._clock = clock
        self._started = clock()  # the head has arrived: the body's time starts now
        self.received = 0
        self.body_done = False
        self.response_started = False
        self.refusal: tuple[Message, Message] | None = None
        self.extra_headers: list[tuple[bytes, bytes]] = []

    async def receive(self) -> Message:
        if self.body_done:  # later calls only wait for a disconnect: no deadline
            return await self._receive()
        if self.refusal is not None:
            return {"type": "http.disconnect"}
        wait = self._limits.body_timeout_s
        due_in = self._due() - self._clock()
        try:
            if due_in <= 0:
                raise TimeoutError
            message = await asyncio.wait_for(self._receive(), min(wait, due_in))
        except TimeoutError:
            self.refusal = _refusal("timeout_error", self._too_slow(wait, due_in), 408)
            return {"type": "http.disconnect"}
        if message["type"] != "http.request":
            self.body_done = True
            return message
        self.received += len(message.get("body", b""))
        if self.received > self._limits.max_body_bytes:
            self.refusal = _refusal("request_too_large", _too_large(self._limits), 413)
            return {"type": "http.disconnect"}
        if not message.get("more_body", False):
            self.body_done = True
        return message

    def _due(self) -> float:
        """When the next byte is due at the minimum average rate (infinity: no such rate)."""
        rate = self._limits.min_body_rate
        if rate <= 0:
            return float("inf")
        return self._started + self._limits.body_timeout_s + self.received / rate

    def _too_slow(self, wait: float, due_in: float) -> str:
        if wait <= due_in or self.received == 0:  # (with nothing received, both coincide)
            return f"request body stalled: nothing received for {wait:g} s"
        elapsed = self._clock() - self._started
        rate = self._limits.min_body_rate
        return (
            f"request body arrived too slowly: {self.received} bytes in {elapsed:.0f} s "
            f"(after the first {self._limits.body_timeout_s:g} s a body must average at "
            f"least {rate / 1024:g} KiB/s)"
        )

    async def send(self, message: Message) -> None:
        if self.refusal is not None:
            return  # the app's answer to a refused body is replaced by the refusal
        if message["type"] == "http.response.start":
            self.response_started = True
            if self.extra_headers:
                message = {**message, "headers": [*message["headers"], *self.extra_headers]}
        await self._send(message)


def _too_large(limits: HttpLimits) -> str:
    mib = limits.max_body_bytes / (1024 * 1024)
    return f"request body is larger than the {mib:g} MiB limit ({limits.max_body_bytes} bytes)"


class RequestGuard:
    """ASGI middleware: host, origin, header-count and body limits before anything else runs."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        allowed_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] = (),
        limits: HttpLimits | None = None,
    ) -> None:
        self.app = app
        self.hosts = HostPolicy(host, allowed_hosts)
        self.origins = frozenset(normalise_origin(o) for o in allowed_origins)
        self.limits = limits or HttpLimits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            origin = self._check_head(scope)
        except _Refused as refused:
            for message in refused.response:
                await send(message)
            return
        cors = self._cors_headers(origin) if origin else []
        if (
            origin
            and scope["method"] == "OPTIONS"
            and _header(scope, b"access-control-request-method")
        ):
            await _preflight(scope, send, cors)
            return
        watch = _BodyWatch(receive, send, self.limits)
        watch.extra_headers = cors
        await self.app(scope, watch.receive, watch.send)
        if watch.refusal is not None and not watch.response_started:
            for message in watch.refusal:
                await send(message)

    def _check_head(self, scope: Scope) -> str | None:
        """Everything decidable from the request head; returns the (allowed) Origin, if any."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if len(headers) > self.limits.max_headers:
            raise _Refused(
                "invalid_request_error",
                f"too many headers ({len(headers)} > {self.limits.max_headers})",
                431,
            )
        # h11 bounds a head only while it is incomplete; one that arrives whole is counted here.
        size = sum(len(name) + len(value) + 4 for name, value in headers)
        if size > self.limits.max_header_bytes:
            raise _Refused(
                "invalid_request_error",
                f"request headers too large ({size} bytes > {self.limits.max_header_bytes})",
                431,
            )
        host = _header(scope, b"host")
        if not self.hosts.allows(host):
            raise _Refused(
                "permission_error",
                f"host {host!r} is not allowed: use 127.0.0.1 or localhost (this check stops "
                "web pages from reaching the server through DNS rebinding)",
                403,
            )
        origin = _header(scope, b"origin")
        if origin is not None and normalise_origin(origin) not in self.origins:
            raise _Refused(
                "permission_error",
                f"origin {origin!r} is not allowed (browsers may not call this server unless "
                "it is started with --allow-origin)",
                403,
            )
        declared = _header(scope, b"content-length")
        if declared is not None:
            # ASCII digits only (`isdigit` takes "²", which int() refuses), and few enough
            # that int() converts them (a 5,000-digit header was a ValueError, a 500).
            digits = declared.strip()
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 20):
                raise _Refused("invalid_request_error", "bad content-length header", 400)
            if int(declared) > self.limits.max_body_bytes:
                raise _Refused("request_too_large", _too_large(self.limits), 413)
        return origin

    def _cors_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", b"retry-after, x-should-retry, request-id"),
            (b"vary", b"Origin"),
        ]


async def _preflight(scope: Scope, send: Send, cors: list[tuple[bytes, bytes]]) -> None:
    """Answer a CORS preflight from an allowed origin (no auth: browsers send none here)."""
    requested = _header(scope, b"access-control-request-headers") or ""
    headers = [
        *cors,
        (b"access-control-allow-methods", _CORS_METHODS.encode()),
        (b"access-control-allow-headers", requested.encode("latin-1")),
        (b"access-control-max-age", b"600"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None
