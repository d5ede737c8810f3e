"""A load test: 200 streaming requests from 16 concurrent clients against the tiny model.

Every request either completes with a well-formed stream or is refused with a 429 envelope
(the engine's admission control); there are no 5xx. Time to first token (first
content_block_start) is measured per request and its p50/p99 printed. Sized to finish in a
few seconds on two CPU cores, bounded at 60 s.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from stream_grammar import check_stream

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.protocol.sse import iter_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOKEN = "load-token"
REQUESTS = 200
CLIENTS = 16
TIME_LIMIT_S = 60.0


@dataclass
class Outcome:
    status: int
    ttft_s: float | None = None
    total_s: float = 0.0


def _body(n: int) -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": f"client request {n}: say something"}],
    }


def _one(client: httpx.Client, n: int) -> Outcome:
    started = time.monotonic()
    ttft: float | None = None
    with client.stream("POST", "/v1/messages", json=_body(n)) as response:
        if response.status_code != 200:
            response.read()
            assert response.status_code == 429, (response.status_code, response.text)
            assert response.json()["error"]["type"] == "rate_limit_error"
            assert int(response.headers["retry-after"]) >= 1
            return Outcome(429, total_s=time.monotonic() - started)
        frames = []
        for frame in iter_frames(response.iter_lines()):
            # The first block starts with the first token the model produced.
            if ttft is None and frame.event == "content_block_start":
                ttft = time.monotonic() - started
            frames.append(frame)
    summary = check_stream(frames)
    assert summary.error is None, summary.error
    assert summary.stop_reason in ("end_turn", "max_tokens")
    assert (ttft is not None) == bool(summary.blocks)  # no blocks: end-of-sequence came first
    return Outcome(200, ttft, time.monotonic() - started)


def _client_run(url: str, numbers: range) -> list[Outcome]:
    headers = {"x-api-key": TOKEN}
    with httpx.Client(base_url=url, headers=headers, timeout=TIME_LIMIT_S) as client:
        return [_one(client, n) for n in numbers]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def test_200_requests_from_16_clients(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    engine.start()
    try:
        with start_server(engine, ServerSettings(auth_token=TOKEN)) as server:
            _client_run(server.url, range(-1, 0))  # load the model outside the timing
            per_client = REQUESTS // CLIENTS
            slices = [
                range(
                    c * per_client,
                    (c + 1) * per_client + (REQUESTS % CLIENTS if c == CLIENTS - 1 else 0),
                )
                for c in range(CLIENTS)
            ]
            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
                futures = [pool.submit(_client_run, server.url, numbers) for numbers in slices]
                outcomes = [o for f in futures for o in f.result(timeout=TIME_LIMIT_S)]
            elapsed = time.monotonic() - started
            stats = engine.stats()
    finally:
        engine.close()

    assert len(outcomes) == REQUESTS
    counts = Counter(o.status for o in outcomes)
    assert set(counts) <= {200, 429}, counts
    assert counts[200] > 0
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    assert len(ttfts) >= 0.9 * counts[200]  # the rest ended at once (end-of-sequence first)
    assert elapsed < TIME_LIMIT_S
    assert stats.running == 0 and stats.queue_depth == 0
    with capsys.disabled():
        print(
            f"\nload: {REQUESTS} requests / {CLIENTS} clients in {elapsed:.1f}s "
            f"({REQUESTS / elapsed:.1f} req/s): {counts[200]} ok, {counts[429]} refused (429), "
            f"0 5xx; ttft p50 {statistics.median(ttfts) * 1000:.0f} ms, "
            f"p99 {_percentile(ttfts, 0.99) * 1000:.0f} ms"
        )
