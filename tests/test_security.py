"""The server's wall, on a real socket: exposure, auth, host and origin checks, size and time
limits, request bounds, and the `model` field rule (SECURITY.md promises each of these)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import mlxlaunch.cli.main  # noqa: F401  (registers the commands on the root app)
from mlxlaunch.cli.app import app as cli_app
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.errors import ConfigError
from mlxlaunch.protocol import limits
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.guards import HostPolicy, HttpLimits, check_exposure, host_name
from mlxlaunch.server.runner import ServerHandle, start_server

TOKEN = "security-test-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ALLOWED_ORIGIN = "http://localhost:3000"
HI = [{"role": "user", "content": "hi"}]
MIB = 1024 * 1024


def _valid(**overrides: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 2, "messages": HI, **overrides}


def _envelope(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    return str(body["error"]["message"])


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    engine.start()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[ServerHandle]:
    settings = ServerSettings(
        auth_token=TOKEN,
        allowed_origins=(ALLOWED_ORIGIN,),
        limits=HttpLimits(header_timeout_s=1.0, body_timeout_s=1.0),
    )
    with start_server(engine, settings) as handle:
        yield handle


# --- exposure -----------------------------------------------------------------------------


def test_exposure_rules() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        check_exposure(host, auth_token=None, allow_remote=False)
    for host in ("0.0.0.0", "::", "192.168.1.7", "my-mac.local"):
        with pytest.raises(ConfigError, match="refusing to listen"):
            check_exposure(host, auth_token="t", allow_remote=False)
        with pytest.raises(ConfigError, match="without authentication"):
            check_exposure(host, auth_token=None, allow_remote=True)
        check_exposure(host, auth_token="t", allow_remote=True)


@pytest.mark.slow
def test_start_server_refuses_a_public_bind(engine: Engine) -> None:
    with pytest.raises(ConfigError, match="refusing to listen"):
        start_server(engine, ServerSettings(host="0.0.0.0", auth_token=TOKEN))
    with pytest.raises(ConfigError, match="without authentication"):
        start_server(engine, ServerSettings(host="0.0.0.0", allow_remote=True))


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0"),
        (["--host", "0.0.0.0", "--allow-remote", "--no-auth"], "without authentication"),
        (["--no-auth", "--auth-token", "x"], "contradict"),
        (["--allow-origin", "evil.example"], "bad origin"),
    ],
)
def test_serve_refuses_unsafe_options_before_loading(args: list[str], reason: str) -> None:
    result = CliRunner().invoke(cli_app, ["serve", "--model", "no-such-model", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError), result.output
    assert reason in result.exception.message


# --- host and origin ------------------------------------------------------------------------


def test_host_header_parsing_and_policy() -> None:
    assert host_name("[::1]:8080") == "::1"
    assert host_name("LocalHost.:80") == "localhost"
    assert host_name("localhost:abc") is None
    assert host_name("[::1") is None
    loopback = HostPolicy("127.0.0.1")
    assert loopback.allows("127.0.0.5:1") and loopback.allows("[::1]")
    assert not loopback.allows("192.168.1.7:8080") and not loopback.allows(None)
    assert not loopback.allows("localhost.evil.example")
    named = HostPolicy("192.168.1.7")
    assert named.allows("192.168.1.7:8080") and not named.allows("10.0.0.1")
    everywhere = HostPolicy("0.0.0.0")
    assert everywhere.allows("10.0.0.1:8080") and everywhere.allows("[fe80::1]:80")
    assert not everywhere.allows("rebind.attacker.example:8080")


@pytest.mark.slow
def test_loopback_hosts_are_served(server: ServerHandle) -> None:
    for host in (
        f"127.0.0.1:{server.port}",
        f"localhost:{server.port}",
        f"[::1]:{server.port}",
        "localhost",
    ):
        response = httpx.get(server.url + "/v1/models", headers={**AUTH, "host": host})
        assert response.status_code == 200, (host, response.text)


@pytest.mark.slow
@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io:{port}", "localhost:abc"]
)
def test_foreign_host_is_403_before_auth(server: ServerHandle, host: str) -> None:
    headers = {"host": host.format(port=server.port)}
    for path in ("/health", "/v1/models"):
        message = _envelope(httpx.get(server.url + path, headers=headers), 403, "permission_error")
        assert "rebinding" in message
    with_token = httpx.post(server.url + "/v1/messages", json=_valid(), headers={**AUTH, **headers})
    _envelope(with_token, 403, "permission_error")


@pytest.mark.slow
def test_missing_host_is_403(server: ServerHandle) -> None:
    reply = _raw(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]


@pytest.mark.slow
@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost:3001"])
def test_foreign_origin_is_403(server: ServerHandle, origin: str) -> None:
    headers = {**AUTH, "origin": origin}
    response = httpx.post(server.url + "/v1/messages", json=_valid(), headers=headers)
    _envelope(response, 403, "permission_error")
    assert "access-control-allow-origin" not in response.headers
    preflight = httpx.options(
        server.url + "/v1/messages",
        headers={"origin": origin, "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 403


@pytest.mark.slow
def test_no_cors_headers_by_default(server: ServerHandle) -> None:
    response = httpx.get(server.url + "/v1/models", headers=AUTH)
    assert response.status_code == 200
    assert not any(name.startswith("access-control-") for name in response.headers)


@pytest.mark.slow
def test_allowed_origin_gets_cors(server: ServerHandle) -> None:
    preflight = httpx.options(
        server.url + "/v1/messages",
        headers={
            "origin": ALLOWED_ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "x-api-key, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "x-api-key" in preflight.headers["access-control-allow-headers"]
    response = httpx.get(server.url + "/v1/models", headers={**AUTH, "origin": ALLOWED_ORIGIN})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    # An allowed origin still needs the token.
    no_token = httpx.get(server.url + "/v1/models", headers={"origin": ALLOWED_ORIGIN})
    _envelope(no_token, 401, "authentication_error")


@pytest.mark.slow
def test_claude_code_headers_pass(server: ServerHandle, fixtures_dir: Path) -> None:
    """Claude Code is no browser: `anthropic-dangerous-direct-browser-access`, no Origin."""
    captured = json.loads((fixtures_dir / "title-request.json").read_text())
    assert "Origin" not in captured["headers"]
    skip = {"host", "content-length", "authorization", "accept-encoding"}
    headers = {k: v for k, v in captured["headers"].items() if k.lower() not in skip}
    body = {**captured["body"], "max_tokens": 2}
    response = httpx.post(
        server.url + captured["path"],
        json=body,
        headers={**headers, **AUTH, "host": f"127.0.0.1:{server.port}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text


# --- authentication -------------------------------------------------------------------------


@pytest.mark.slow
def test_every_route_but_health_and_hello_needs_the_token(server: ServerHandle) -> None:
    url = server.url
    for method, path in [
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/claude-x"),
        ("GET", "/v1/stats"),
    ]:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": TOKEN + "x"}):
            response = httpx.request(method, url + path, json=_valid(), headers=headers)
            _envelope(response, 401, "authentication_error")
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.head(url + "/api/hello").status_code == 200  # Claude Code's bare probe


# --- size and time limits -------------------------------------------------------------------


def _raw(server: ServerHandle, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send raw bytes, return everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _head(length: int | None, *, chunked: bool = False) -> bytes:
    lines = [
        b"POST /v1/messages HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Authorization: Bearer " + TOKEN.encode(),
        b"Content-Type: application/json",
    ]
    if length is not None:
        lines.append(b"Content-Length: %d" % length)
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.mark.slow
def test_declared_33_mib_body_is_413_before_reading_it(server: ServerHandle) -> None:
    started = time.monotonic()
    # Only 64 KiB of the declared 33 MiB are ever sent: the answer cannot depend on the rest.
    reply = _raw(server, _head(33 * MIB) + b"{" + b" " * 65535)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b'"request_too_large"' in reply and b"32 MiB" in reply
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_undeclared_body_is_cut_off_at_the_limit(server: ServerHandle) -> None:
    """A chunked upload is counted as it arrives; the server stops reading after 32 MiB."""
    sent = 0
    chunk = b"%x\r\n%s\r\n" % (MIB, b" " * MIB)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_head(None, chunked=True) + b"1\r\n{\r\n")

        def upload() -> None:
            nonlocal sent
            try:
                for _ in range(64):
                    sock.sendall(chunk)
                    sent += MIB
            except OSError:
                pass  # the server closed the connection: what we want

        sender = threading.Thread(target=upload, daemon=True)
        sender.start()
        reply = _read_all(sock)
        sender.join(10)
    assert sent < 64 * MIB, "the server read the whole 64 MiB body"
    if reply:  # a reset may race the response; if it arrived, it is the 413 envelope
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.slow
def test_stalled_upload_is_408(server: ServerHandle) -> None:
    started = time.monotonic()
    reply = _raw(server, _head(1000) + b'{"model": ')
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert b'"timeout_error"' in reply
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_slow_request_head_is_cut_off(server: ServerHandle) -> None:
    started = time.monotonic()
    reply = _raw(server, b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert reply == b"" and time.monotonic() - started < 5


@pytest.mark.slow
def test_header_count_and_size_limits(server: ServerHandle) -> None:
    many = {f"x-filler-{i}": "1" for i in range(150)}
    response = httpx.get(server.url + "/health", headers=many)
    _envelope(response, 431, "invalid_request_error")
    big = httpx.get(server.url + "/health", headers={"x-filler": "a" * 100_000})
    _envelope(big, 431, "invalid_request_error")
    # A head still incomplete past the limit is refused by uvicorn's parser (plain 400).
    trickled = _raw(
        server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + b"a" * 300_000
    )
    assert trickled.startswith(b"HTTP/1.1 400"), trickled[:200]
    assert httpx.get(server.url + "/health").status_code == 200


# --- request bounds -------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"x": value}}
    return value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "names"),
    [
        (_valid(tools=[{"name": "t", "input_schema": _nested(40)}]), "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (_valid(max_tokens=limits.MAX_OUTPUT_TOKENS + 1), "max_tokens:"),
        (_valid(temperature=1.5), "temperature:"),
        (_valid(top_k=limits.MAX_TOP_K + 1), "top_k:"),
        (_valid(thinking={"type": "enabled", "budget_tokens": 1 << 30}), "budget_tokens:"),
        (_valid(stop_sequences=["x"] * (limits.MAX_STOP_SEQUENCES + 1)), "stop_sequences:"),
        (_valid(stop_sequences=["x" * 5000]), "stop_sequences.0:"),
        (
            _valid(tools=[{"name": f"t{i}", "input_schema": {}} for i in range(1001)]),
            "tools:",
        ),
        (_valid(tools=[{"name": "t" * 300, "input_schema": {}}]), "tools.0.name:"),
        (_valid(messages=[{"role": "user", "content": "x"}] * 100_001), "messages:"),
        (
            _valid(
                messages=[{"role": "user", "content": [{"type": "text", "text": "x"}] * 10_001}]
            ),
            "messages.0.content:",
        ),
    ],
    ids=lambda v: None if isinstance(v, str) else "",
)
def test_bounds_are_clear_400s(server: ServerHandle, body: Any, names: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        server.url + "/v1/messages",
        content=content,
        headers={**AUTH, "content-type": "application/json"},
        timeout=60,
    )
    assert names in _envelope(response, 400, "invalid_request_error")


# --- the model field ------------------------------------------------------------------------

PATHS_AND_URLS = [
    "/etc/passwd",
    "./models/qwen",
    "../qwen",
    "~/models/qwen",
    "https://huggingface.co/mlx-community/Qwen3-4B-4bit",
    "file:///etc/passwd",
    "hf://mlx-community/Qwen3-4B-4bit",
    "C:\\models\\qwen",
    "models\\qwen",
    "org/name/sub",
    "org/../name",
    "/",
    "org/",
    "line\nbreak",
]
PLAIN_IDS = [
    "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5-20251001",
    "claude-opus-4-1[1m]",
    "mlx-community/Qwen3-4B-4bit",
    "qwen3:8b",
    "demo",
    "local-model.v2",
]


@pytest.mark.parametrize("model_id", PLAIN_IDS)
def test_plain_model_ids_are_accepted(model_id: str) -> None:
    assert limits.check_model_id(model_id) == model_id
    assert limits.plain_model_id(model_id) == model_id


def test_cli_paths_become_plain_ids() -> None:
    assert limits.plain_model_id("./models/qwen/") == "qwen"
    assert limits.plain_model_id("/abs/path/Qwen3-4B") == "Qwen3-4B"
    assert limits.check_model_id(limits.plain_model_id("~/.hidden")) == "hidden"


@pytest.mark.slow
def test_a_path_or_url_as_model_is_400_and_loads_nothing(tiny_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    engine.start()
    try:
        with start_server(engine, ServerSettings(auth_token=TOKEN)) as handle:
            for model_id in [*PATHS_AND_URLS, str(tiny_model_dir)]:
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    response = httpx.post(
                        handle.url + path, json=_valid(model=model_id), headers=AUTH
                    )
                    message = _envelope(response, 400, "invalid_request_error")
                    assert message.startswith("model:"), message
            assert engine.model_info is None
            assert engine.stats().state == "unloaded"
    finally:
        engine.close()


@pytest.mark.parametrize("declared", ["\u00b2", "7" * 5000, "-1", "1e3"])
def test_a_content_length_int_refuses_is_a_400(declared: str) -> None:
    """`isdigit` takes "²", and int() refuses it (and 5,000 digits): those were a 500."""
    import asyncio

    from mlxlaunch.server.guards import RequestGuard

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the guard let it through")

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "headers": [(b"host", b"127.0.0.1"), (b"content-length", declared.encode("latin-1"))],
    }
    asyncio.run(RequestGuard(app)(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
