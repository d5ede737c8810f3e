"""Issue 19 item 7: idle sockets cannot starve the served, and a body cannot trickle forever.

520 idle connections without a token made uvicorn answer every later request, `/health`
included, with a plain-text 503, and a body trickled at a byte per 20 s was never timed out.
The roster's policy is tested with fake connections; the rest on a real uvicorn on a real
socket, with raw sockets for the flood and limits shrunk so that it stays fast (40
connections, a flood of 60).
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from mlxlaunch.engine.types import EngineEvent, GenerationRequest, ModelInfo
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.connections import ConnectionRoster, peer_key
from mlxlaunch.server.guards import HttpLimits
from mlxlaunch.server.runner import ServerHandle, start_server

CAPACITY = 40
FLOOD = 60
MIB = 1024 * 1024


# --- the roster's policy, with fake connections ---------------------------------------------


class FakeConnection:
    def __init__(self, peer: str | None = None) -> None:
        self.peer = peer
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def _open(roster: ConnectionRoster, count: int, peer: str | None = None) -> list[FakeConnection]:
    conns = [FakeConnection(peer) for _ in range(count)]
    for conn in conns:
        roster.opened(conn)
    return conns


def test_a_newcomer_at_capacity_closes_the_longest_idle_connection() -> None:
    roster = ConnectionRoster(3, per_peer=3)
    a, b, c = _open(roster, 3)
    assert roster.request_started(a)
    roster.request_ended(a)  # kept alive: now the most recently idle
    (d,) = _open(roster, 1)
    assert b.dropped and not (a.dropped or c.dropped or d.dropped)
    assert roster.admitted == 3 and roster.evicted == 1


def test_busy_connections_are_never_closed_and_only_then_is_a_newcomer_refused() -> None:
    roster = ConnectionRoster(2, per_peer=2)
    a, b = _open(roster, 2)
    assert roster.request_started(a) and roster.request_started(b)
    c, d = _open(roster, 2)  # every connection is serving: they wait for their heads
    assert roster.waiting == 2 and not any(x.dropped for x in (a, b, c, d))
    assert not roster.request_started(c)  # still no room when its head arrives: refused
    assert roster.refused == 1
    roster.request_ended(a)  # a is idle now: d's head makes room by closing it
    assert roster.request_started(d) and a.dropped and roster.busy == 2


def test_a_waiting_connection_is_served_when_room_was_freed() -> None:
    roster = ConnectionRoster(1, per_peer=1)
    (a,) = _open(roster, 1)
    assert roster.request_started(a)
    (b,) = _open(roster, 1)
    roster.closed(a)
    assert roster.request_started(b) and roster.waiting == 0 and roster.busy == 1


def test_the_waiting_room_is_bounded() -> None:
    roster = ConnectionRoster(1, per_peer=1, waiting_room=2)
    (a,) = _open(roster, 1)
    assert roster.request_started(a)
    first, second, third = _open(roster, 3)
    assert first.dropped and not (second.dropped or third.dropped) and roster.waiting == 2


def test_a_remote_peer_displaces_only_its_own_idle_connections() -> None:
    roster = ConnectionRoster(10, per_peer=2)
    (local,) = _open(roster, 1)  # the oldest idle connection of all
    x1, x2 = _open(roster, 2, peer="192.0.2.9")
    assert roster.request_started(x2)
    (x3,) = _open(roster, 1, peer="192.0.2.9")
    assert x1.dropped and not local.dropped
    assert roster.request_started(x3)
    (x4,) = _open(roster, 1, peer="192.0.2.9")  # both of its connections are busy
    assert not roster.request_started(x4) and not local.dropped
    assert roster.admitted == 3


def test_loopback_peers_are_held_to_the_global_capacity_only() -> None:
    roster = ConnectionRoster(10, per_peer=2)
    local = _open(roster, 10, peer=peer_key("127.0.0.1"))
    assert roster.admitted == 10 and not any(conn.dropped for conn in local)


def test_peer_keys() -> None:
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", None, ""):
        assert peer_key(loopback) is None
    assert peer_key("::ffff:192.0.2.7") == peer_key("192.0.2.7") == "192.0.2.7"
    assert peer_key("2001:db8::1") == peer_key("2001:db8::ffff:2") == "2001:db8::/64"
    assert peer_key("2001:db8:0:1::1") != peer_key("2001:db8::1")
    assert peer_key("fe80::1%eth0") == "fe80::/64"


# --- a real server on a real socket ---------------------------------------------------------


class IdleEngine:
    """Answers `count_tokens`; no test here generates."""

    @property
    def model_info(self) -> ModelInfo | None:
        return ModelInfo(id="idle", path="/nowhere", context_window=4096)

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        return self.model_info

    async def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]:
        raise AssertionError("not used")
        yield  # pragma: no cover

    def cancel(self, request_id: str) -> None:
        pass

    async def count_tokens(self, req: GenerationRequest) -> int:
        return 1


@contextmanager
def _server(limits: HttpLimits, host: str = "127.0.0.1") -> Iterator[ServerHandle]:
    remote = host != "127.0.0.1"
    settings = ServerSettings(
        host=host, limits=limits, allow_remote=remote, auth_token="t" if remote else None
    )
    with start_server(IdleEngine(), settings) as handle:
        yield handle


def _connect(handle: ServerHandle, first_bytes: bytes = b"") -> socket.socket:
    sock = socket.create_connection((handle.host, handle.port), timeout=5)
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def _closed_by_server(socks: list[socket.socket], wait_s: float = 1.0) -> int:
    """How many of `socks` the server has closed (their reads see end of file)."""
    closed = 0
    with selectors.DefaultSelector() as selector:  # select() stops at descriptor 1024
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ, sock)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and (ready := selector.select(left)):
            for key, _ in ready:
                peer: socket.socket = key.data
                try:
                    ended = peer.recv(65536) == b""
                except OSError:
                    ended = True
                if ended:
                    closed += 1
                    selector.unregister(peer)
    return closed


def _read_reply(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def test_health_answers_during_an_idle_flood() -> None:
    # A long head deadline: the flood stays until the roster closes it, not the deadline.
    limits = HttpLimits(max_connections=CAPACITY, header_timeout_s=60.0)
    with _server(limits) as handle:
        # Half say nothing, half trickle a head that never completes; none has a token.
        flood = [_connect(handle, PARTIAL_HEAD if i % 2 else b"") for i in range(FLOOD)]
        try:
            _wait_until(lambda: handle.connections.admitted + handle.connections.waiting >= 40)
            slowest = 0.0
            with httpx.Client(base_url=handle.url, timeout=5) as kept_alive:
                for _ in range(20):
                    started = time.monotonic()
                    fresh = httpx.get(handle.url + "/health", timeout=5)
                    again = kept_alive.get("/health")
                    slowest = max(slowest, time.monotonic() - started)
                    for response in (fresh, again):
                        assert response.status_code == 200, response.text
                        assert response.json()["status"] == "ok"
            # The oldest idle connections gave way: the flood's excess, then one per client.
            assert _closed_by_server(flood) >= FLOOD - CAPACITY + 1
            assert handle.connections.admitted <= CAPACITY
            assert slowest < 2.0, f"/health took {slowest:.2f} s during the flood"
        finally:
            for sock in flood:
                sock.close()


def _stalled_post(handle: ServerHandle) -> socket.socket:
    """A request head whose body never comes: a connection serving a request."""
    head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    return _connect(handle, head)


def test_a_newcomer_is_refused_with_the_envelope_only_when_every_connection_is_busy() -> None:
    limits = HttpLimits(max_connections=CAPACITY, body_timeout_s=3.0)
    with _server(limits) as handle:
        busy = [_stalled_post(handle) for _ in range(CAPACITY)]
        try:
            _wait_until(lambda: handle.connections.busy == CAPACITY)
            refused = httpx.get(handle.url + "/health", timeout=5)
            assert refused.status_code == 529, refused.text
            assert refused.headers["content-type"] == "application/json"
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["x-should-retry"] == "true"
            assert refused.headers["request-id"].startswith("req_")
            body = refused.json()
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
            assert handle.connections.busy == CAPACITY  # nobody served was cut off
            assert handle.connections.refused == 1
            # The stalled bodies time out (408), and the server serves again.
            replies = [_read_reply(sock, timeout=10) for sock in busy]
            assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies), replies[0]
            assert httpx.get(handle.url + "/health", timeout=5).status_code == 200
        finally:
            for sock in busy:
                sock.close()


def test_a_trickled_body_is_408_and_the_connection_closed() -> None:
    """A byte every 0.3 s beats a 1 s per-piece deadline forever; not the average rate."""
    limits = HttpLimits(body_timeout_s=1.0)
    declared = 1000
    with _server(limits) as handle:
        sock = _connect(
            handle,
            b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % declared,
        )
        stop = threading.Event()

        def trickle() -> None:
            for _ in range(declared - 1):
                if stop.wait(0.3):
                    return
                try:
                    sock.sendall(b" ")
                except OSError:
                    return  # the server closed the connection: what we want

        sender = threading.Thread(target=trickle, daemon=True)
        started = time.monotonic()
        sender.start()
        try:
            reply = _read_reply(sock, timeout=6)  # ends when the server closes the connection
            took = time.monotonic() - started
        finally:
            stop.set()
            sender.join(5)
            sock.close()
        assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
        envelope = json.loads(reply.partition(b"\r\n\r\n")[2])
        assert envelope["error"]["type"] == "timeout_error"
        assert "too slowly" in envelope["error"]["message"]
        assert took < 4, f"the trickle was cut off after {took:.1f} s"


def test_a_fast_large_body_meets_a_strict_rate() -> None:
    """Over loopback even a large body arrives far faster than the deadline asks."""
    limits = HttpLimits(body_timeout_s=1.0, min_body_rate=8 * MIB)
    text = "x" * (24 * MIB)
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    with _server(limits) as handle:
        response = httpx.post(handle.url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert response.json() == {"input_tokens": 1}


def _own_remote_address() -> str | None:
    """An address of this machine that is not loopback (none: the test is skipped)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if peer_key(address) is None or address == "0.0.0.0" else address


def test_a_remote_peer_is_held_to_its_own_cap() -> None:
    address = _own_remote_address()
    if address is None:
        pytest.skip("this machine has no address beyond loopback")
    limits = HttpLimits(max_connections=CAPACITY, max_connections_per_peer=5)
    with _server(limits, host=address) as handle:
        head = PARTIAL_HEAD.replace(b"127.0.0.1", address.encode())
        idle = [_connect(handle, head) for _ in range(8)]
        try:
            _wait_until(lambda: handle.connections.admitted == 5)
            assert _closed_by_server(idle) == 3  # its own oldest gave way
            response = httpx.get(handle.url + "/health", timeout=5)
            assert response.status_code == 200, response.text
            assert handle.connections.admitted <= 5
        finally:
            for sock in idle:
                sock.close()
