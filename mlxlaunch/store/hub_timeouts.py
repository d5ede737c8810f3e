"""How long a hub call may wait, and the error when the hub does not answer in time.

Every request store/ sends to the hub (model info, small JSON files, downloads) carries a
connect timeout and a read timeout from `HubTimeouts`; running out of either is `HubTimeout`.

Why our own: huggingface_hub 2.x sends everything through one shared httpx2 client made with
`timeout=None`, and `HfApi.model_info` passes `timeout=None` on unless told otherwise, so a hub
that accepted the connection and never answered kept `mlx models pull` waiting forever, silently.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import httpx2

from mlxlaunch.errors import ConfigError, NetworkError

# Seconds of silence allowed on a hub connection; the hint names it for slow links.
HUB_TIMEOUT_ENV = "MLXLAUNCH_HUB_TIMEOUT"
# huggingface_hub's own knob, honoured when ours is not set (read here at call time).
HF_DOWNLOAD_TIMEOUT_ENV = "HF_HUB_DOWNLOAD_TIMEOUT"
DEFAULT_READ_S = 30.0
# A TCP handshake needs no server work: 10 s is long even across the world.
MAX_CONNECT_S = 10.0

Phase = Literal["connect", "read"]


@dataclass(frozen=True)
class HubTimeouts:
    """The connect and read timeouts of one hub request, in seconds.

    `read_s` bounds each wait for the next bytes (headers or body), not the whole transfer, so
    a large download that keeps moving never times out.
    """

    read_s: float = DEFAULT_READ_S
    connect_s: float = MAX_CONNECT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HubTimeouts:
        """`MLXLAUNCH_HUB_TIMEOUT` (else `HF_HUB_DOWNLOAD_TIMEOUT`, else 30) seconds of read
        timeout; the connect timeout is the same, at most 10 s.

        Raises:
            ConfigError: the variable is not a positive number of seconds.
        """
        env = os.environ if env is None else env
        for name in (HUB_TIMEOUT_ENV, HF_DOWNLOAD_TIMEOUT_ENV):
            if text := env.get(name, "").strip():
                read_s = _seconds(name, text)
                return cls(read_s=read_s, connect_s=min(MAX_CONNECT_S, read_s))
        return cls()

    def httpx(self) -> httpx2.Timeout:
        """The same bounds as httpx2 takes them (writes and the pool wait get `read_s`)."""
        return httpx2.Timeout(self.read_s, connect=self.connect_s)


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(
            f"{name}={text!r} is not a number of seconds above 0", hint=f"e.g. {name}=120"
        )
    return value


class HubTimeout(NetworkError):
    """The hub accepted (or never completed) a connection but sent nothing in time.

    Attributes:
        endpoint: the hub's base URL.
        seconds: the timeout that ran out.
        phase: "connect" (no TCP connection in time) or "read" (connected, no bytes in time).
        target: what was being fetched (a file name or an API path), if known.
    """

    def __init__(self, endpoint: str, seconds: float, phase: Phase, target: str | None) -> None:
        what = f" ({target})" if target else ""
        if phase == "connect":
            message = f"could not connect to the hub at {endpoint} within {seconds:g} s{what}"
        else:
            message = f"the hub at {endpoint} did not answer within {seconds:g} s{what}"
        super().__init__(
            message,
            hint=(
                "run the same pull again to retry (downloads resume where they stopped); "
                f"on a slow link allow longer, e.g. {HUB_TIMEOUT_ENV}=120"
            ),
        )
        self.endpoint = endpoint
        self.seconds = seconds
        self.phase: Phase = phase
        self.target = target


def hub_timeout(exc: httpx2.TimeoutException, endpoint: str, timeouts: HubTimeouts) -> HubTimeout:
    """The typed error for an httpx2 timeout on a request to `endpoint`."""
    target = None
    with contextlib.suppress(RuntimeError):  # an exception raised without its request
        path = exc.request.url.path
        # A file's name says more than its URL; API calls keep their path.
        target = path.split("/resolve/", 1)[1].split("/", 1)[-1] if "/resolve/" in path else path
    if isinstance(exc, httpx2.ConnectTimeout):
        return HubTimeout(endpoint, timeouts.connect_s, "connect", target)
    return HubTimeout(endpoint, timeouts.read_s, "read", target)


def transport_failure(exc: BaseException) -> str:
    """Why a connection failed, in words, from the OS error httpx wraps (its own message is
    often only the class name, `ConnectError`): the name that does not resolve, a refusal,
    an unreachable network, a TLS failure."""
    host = None
    with contextlib.suppress(RuntimeError, AttributeError):  # raised without its request
        host = exc.request.url.host  # type: ignore[attr-defined]
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror):
            name = f"the name {host!r}" if host else "the host name"
            return f"{name} does not resolve (DNS: {cause.strerror or cause})"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused (nothing listens there)"
        if isinstance(cause, ssl.SSLError):
            return f"the TLS handshake failed ({cause.reason or cause})"
        if isinstance(cause, OSError) and cause.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return f"the network is unreachable ({cause.strerror})"
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip()
    if "Name or service not known" in text or "nodename nor servname" in text:
        return f"the name {host!r} does not resolve (DNS: {text})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
