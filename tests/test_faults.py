"""Fault injection against the real server and engine (tiny model): clients that vanish
mid-stream or stop reading, a forward pass that raises, a model that cannot load, an unload
while requests run. In every case the other requests complete, the server keeps serving, and
nothing leaks: the running count returns to zero and MLX memory to its baseline."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
from stream_grammar import check_stream

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import GenerationRequest
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.failing import ForwardFailures, fail_forward

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOKEN = "faults-token"
AUTH = {"x-api-key": TOKEN}
# Leaked KV caches of the requests below would be several MiB; buffers MLX keeps for reuse
# are not "active" memory.
MEMORY_SLACK_BYTES = 2 * 1024 * 1024


def _body(n: int, *, max_tokens: int = 16, stream: bool = False) -> dict[str, Any]:
    # Distinct prompts: identical requests would share one generation (engine dedupe).
    text = f"request {n}: " + "tell me a long story about the sea " * 8
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


NEVER_STOP = "NEVER STOP"


def _never_stop_hook(request: GenerationRequest, tokenizer: Any) -> list[Any] | None:
    """Test double at the logits: a request marked NEVER STOP cannot sample end-of-sequence,
    so it is guaranteed to still be generating when the test needs it to be."""
    if not any(NEVER_STOP in message.content for message in request.messages):
        return None
    eos_ids = sorted(int(i) for i in tokenizer.eos_token_ids)

    def ban_eos(tokens: mx.array, logits: mx.array) -> mx.array:
        ids = mx.arange(logits.shape[-1])
        banned = mx.zeros(ids.shape, dtype=mx.bool_)
        for eos in eos_ids:
            banned = banned | (ids == eos)
        return mx.where(banned, mx.array(-mx.inf, dtype=logits.dtype), logits)

    return [ban_eos]


@dataclass
class Target:
    engine: Engine
    server: ServerHandle
    failures: ForwardFailures
    baseline_bytes: int

    def post(self, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
        return httpx.post(
            self.server.url + "/v1/messages", json=body, headers=AUTH, timeout=timeout
        )

    def settled(self, timeout: float = 15.0) -> None:
        """Wait for the engine to be idle, then check that nothing was left behind."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            if stats.running == 0 and stats.queue_depth == 0:
                break
            assert time.monotonic() < deadline, f"engine never settled: {stats}"
            time.sleep(0.05)
        ok = self.post(_body(10_000, max_tokens=2))
        assert ok.status_code == 200, ok.text
        time.sleep(0.2)  # let the worker finish its bookkeeping for that last request
        gc.collect()
        active = int(mx.get_active_memory())
        print(f"memory: baseline {self.baseline_bytes:,} B, now {active:,} B")
        assert active <= self.baseline_bytes + MEMORY_SLACK_BYTES


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path) -> Iterator[Target]:
    failures = ForwardFailures()
    engine = Engine(
        EngineConfig(
            model=str(tiny_model_dir),
            max_concurrency=4,
            model_wrapper=fail_forward(failures),
            logits_hook=_never_stop_hook,
            cache_memory_bytes=0,  # no prefix cache: memory must return to the baseline
        )
    )
    engine.start()
    server = start_server(engine, ServerSettings(auth_token=TOKEN))
    try:
        target = Target(engine, server, failures, 0)
        for n in range(2):  # warm up: load, compile, first allocations
            assert target.post(_body(-1 - n, max_tokens=8)).status_code == 200
        gc.collect()
        time.sleep(0.2)
        target.baseline_bytes = int(mx.get_active_memory())
        yield target
    finally:
        server.stop()
        engine.close()


def _in_parallel(jobs: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return [f.result(timeout=120) for f in [pool.submit(job) for job in jobs]]


def _complete(target: Target, n: int) -> None:
    response = target.post(_body(n, max_tokens=12))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["output_tokens"] >= 1


def _stream_until(target: Target, n: int, cut_after: int) -> int:
    """Stream a long answer and hang up after `cut_after` bytes (0: right after sending)."""
    # The answer must outlast the cut: a random model that ends its turn early would leave the
    # kept-alive connection open and this loop waiting for bytes that never come.
    body = _body(n, max_tokens=400, stream=True)
    body["messages"][0]["content"] += NEVER_STOP
    head, payload = _raw_request(target, body)
    with socket.create_connection(("127.0.0.1", target.server.port), timeout=30) as sock:
        sock.sendall(head + payload)
        received = 0
        while received < cut_after:
            chunk = sock.recv(min(4096, cut_after - received))
            if not chunk:
                break
            received += len(chunk)
    return received


def _raw_request(target: Target, body: dict[str, Any]) -> tuple[bytes, bytes]:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{target.server.port}\r\n"
        f"x-api-key: {TOKEN}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    return head, payload


def test_clients_hanging_up_at_random_points(target: Target) -> None:
    rng = random.Random(20261201)
    cuts = [0, 1, 200, *(rng.randint(300, 6000) for _ in range(9))]
    jobs: list[Callable[[], Any]] = [
        partial(_stream_until, target, n, cut) for n, cut in enumerate(cuts)
    ]
    jobs += [partial(_complete, target, 100 + n) for n in range(4)]
    started = time.monotonic()
    received = _in_parallel(jobs)[: len(cuts)]
    assert sum(received) > 10_000  # the streams really were under way when cut
    print(
        f"\nfaults: {len(cuts)} hang-ups + 4 complete requests in {time.monotonic() - started:.1f}s"
    )
    target.settled()


def test_a_client_that_stops_reading_blocks_no_one(target: Target) -> None:
    body = _body(200, max_tokens=30_000, stream=True)
    body["messages"][0]["content"] += NEVER_STOP
    head, payload = _raw_request(target, body)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", target.server.port))
    try:
        stalled.sendall(head + payload)
        time.sleep(1.0)  # let its stream fill the socket buffers
        started = time.monotonic()
        _in_parallel([partial(_complete, target, 300 + n) for n in range(4)])
        elapsed = time.monotonic() - started
        print(f"\nfaults: 4 requests beside a stalled reader took {elapsed:.1f}s")
        assert target.engine.stats().running >= 1  # the stalled stream is still there ...
    finally:
        stalled.close()  # ... until its client goes away
    target.settled()


def test_a_failing_forward_fails_its_requests_only(target: Target) -> None:
    def stream(n: int) -> str:
        response = target.post(_body(n, max_tokens=40, stream=True))
        if response.status_code != 200:
            assert response.json()["error"]["type"] == "api_error"
            return "error-status"
        summary = check_stream(parse_frames(response.text))
        return "error-event" if summary.error is not None else "ok"

    target.failures.fail_next(times=1, after=5)
    try:
        outcomes = _in_parallel([partial(stream, 400 + n) for n in range(4)])
    finally:
        target.failures.heal()
    print(f"\nfaults: outcomes with one failed forward pass: {outcomes}")
    assert target.failures.failures == 1
    assert any(o != "ok" for o in outcomes)
    _in_parallel([partial(_complete, target, 500 + n) for n in range(2)])
    target.settled()


def test_an_unload_during_requests(target: Target) -> None:
    def stream(n: int) -> str:
        response = target.post(_body(n, max_tokens=200, stream=True))
        if response.status_code != 200:
            assert response.json()["type"] == "error"
            return "error-status"
        summary = check_stream(parse_frames(response.text))
        return "error-event" if summary.error is not None else "ok"

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(stream, 600 + n) for n in range(3)]
        # Until all three are in the engine (not a fixed 0.5 s: on a busy machine one request
        # still on its way would arrive after the unload and load the model again).
        deadline = time.monotonic() + 60
        while (stats := target.engine.stats()).running + stats.queue_depth < 3:
            assert time.monotonic() < deadline, "the requests never reached the engine"
            time.sleep(0.01)
        asyncio.run(target.engine.unload())
        outcomes = [f.result(timeout=60) for f in futures]
    print(f"\nfaults: outcomes of requests caught by an unload: {outcomes}")
    assert target.engine.model_info is None  # nothing reloaded behind our back
    _complete(target, 700)  # loads again on demand
    target.settled()


def test_a_model_that_fails_to_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated download
    engine = Engine(EngineConfig(model=str(broken)))
    engine.start()
    try:
        with start_server(engine, ServerSettings(auth_token=TOKEN)) as server:
            url = server.url
            for attempt in range(2):  # a failed load is retried, and fails the same way
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    response = httpx.post(url + path, json=_body(attempt), headers=AUTH, timeout=60)
                    assert response.status_code >= 500, response.text
                    error = response.json()
                    assert error["type"] == "error" and "load" in error["error"]["message"]
            assert httpx.get(url + "/health").json()["status"] == "ok"
            stats = engine.stats()
            assert stats.running == 0 and stats.queue_depth == 0
    finally:
        engine.close()
