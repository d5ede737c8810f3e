"""`/metrics`, `/v1/stats` and `/v1/stats/stream` on a real server with the tiny test model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from engine_helpers import served_engine
from prometheus_client.parser import text_string_to_metric_families

from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.stats import EngineStats, StatsBook
from mlxlaunch.protocol.sse import SseFrame, iter_frames, parse_frames
from mlxlaunch.protocol.stats import STATS_EVENT, STATS_VERSION, StatsSnapshot
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.server.stats_routes import close_streams

TOKEN = "metrics-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
HI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]


@dataclass
class Served:
    engine: Engine
    server: ServerHandle

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.server.url + path, timeout=30, **kw)

    def ask(self, max_tokens: int = 3) -> anthropic.types.Message:
        client = anthropic.Anthropic(base_url=self.server.url, api_key=TOKEN, max_retries=0)
        return client.messages.create(model="local-x", max_tokens=max_tokens, messages=HI)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    with served_engine(tiny_model_dir, TOKEN) as (engine, server):
        try:
            yield Served(engine, server)
        finally:
            close_streams(engine)  # before the server stops, as a shutdown does


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(
    scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


# --- auth ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/metrics", "/v1/stats", "/v1/stats/stream"])
def test_stats_routes_refuse_requests_without_the_token(served: Served, path: str) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "nope"}):
        response = served.get(path, headers=headers)
        assert response.status_code == 401, (path, headers)
        assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.slow
def test_metrics_accepts_the_token_either_way(served: Served) -> None:
    assert served.get("/metrics", headers=AUTH).status_code == 200
    assert served.get("/metrics", headers={"x-api-key": TOKEN}).status_code == 200


# --- /metrics -----------------------------------------------------------------------------


@pytest.mark.slow
def test_metrics_parse_and_counters_move_by_the_requests_made(served: Served) -> None:
    before = samples(served.get("/metrics", headers=AUTH).text)
    messages = [served.ask(max_tokens=n) for n in (2, 4)]
    response = served.get("/metrics", headers=AUTH)
    assert response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("mlxlaunch_requests_total", outcome="completed") == 2
    assert delta("mlxlaunch_requests_admitted_total") == 2
    assert delta("mlxlaunch_requests_total", outcome="failed") == 0
    output = sum(m.usage.output_tokens for m in messages)
    prompt = sum(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) for m in messages)
    cached = sum(m.usage.cache_read_input_tokens or 0 for m in messages)
    assert delta("mlxlaunch_generated_tokens_total") == output
    assert delta("mlxlaunch_prompt_tokens_total") == prompt
    assert delta("mlxlaunch_cached_prompt_tokens_total") == cached
    assert delta("mlxlaunch_time_to_first_token_seconds_count") == 2
    assert delta("mlxlaunch_time_to_first_token_seconds_sum") > 0
    assert value(after, "mlxlaunch_time_to_first_token_seconds_bucket", le="+Inf") == value(
        after, "mlxlaunch_time_to_first_token_seconds_count"
    )
    # Gauges are present with their units in the name.
    assert value(after, "mlxlaunch_model_state", state="loaded") == 1
    assert value(after, "mlxlaunch_model_state", state="unloaded") == 0
    assert value(after, "mlxlaunch_queue_depth") == 0
    assert value(after, "mlxlaunch_requests_running") == 0
    assert ("mlxlaunch_memory_active_bytes", ()) in after
    assert ("mlxlaunch_prefill_tokens_per_second", ()) in after
    assert ("mlxlaunch_prefix_cache_hit_ratio", ()) in after
    # A scrape that saw no new requests does not count the old ones again.
    again = samples(served.get("/metrics", headers=AUTH).text)
    assert value(again, "mlxlaunch_time_to_first_token_seconds_count") == value(
        after, "mlxlaunch_time_to_first_token_seconds_count"
    )


# --- /v1/stats and the stream ----------------------------------------------------------------


@pytest.mark.slow
def test_stats_snapshot_lists_the_requests_with_their_tokens(served: Served) -> None:
    message = served.ask(max_tokens=3)
    snap = served.get("/v1/stats", headers=AUTH).json()
    assert snap["model"]["state"] == "loaded" and snap["version"] == STATS_VERSION
    record = next(r for r in snap["recent"] if r["request_id"] == message.id)
    assert record["output_tokens"] == message.usage.output_tokens
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert record["prompt_tokens"] == prompt
    assert record["kind"] in ("main", "subagent", "title", "other")
    assert record["model_alias"] == "local-x"
    assert record["ttft_s"] > 0
    assert set(snap["cache"]) >= {"hit_ratio", "bytes", "disk_bytes", "last_miss"}
    assert snap["counters"]["requests_completed"] >= 1


@pytest.mark.slow
def test_stats_stream_sends_a_snapshot_about_every_second(served: Served) -> None:
    served.ask(max_tokens=1)  # the model is loaded, whichever of the module's tests ran before
    events: list[StatsSnapshot] = []
    started = time.monotonic()
    with httpx.stream("GET", served.server.url + "/v1/stats/stream", headers=AUTH, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for frame in iter_frames(r.iter_lines()):
            assert frame.event == STATS_EVENT
            events.append(StatsSnapshot.model_validate_json(frame.data))
            if len(events) == 2:
                break
    elapsed = time.monotonic() - started
    assert 0.5 < elapsed < 3.0
    assert all(e.model.state == "loaded" for e in events)
    assert events[1].time > events[0].time


def test_close_streams_ends_open_streams_at_once() -> None:
    class Idle:
        def stats(self) -> EngineStats:
            return StatsBook(time.monotonic).snapshot()

    engine = Idle()
    server = start_server(engine, ServerSettings())  # type: ignore[arg-type]
    try:
        frames: list[SseFrame] = []

        def follow() -> None:
            with httpx.stream("GET", server.url + "/v1/stats/stream", timeout=10) as r:
                for frame in iter_frames(r.iter_lines()):
                    frames.append(frame)

        reader = threading.Thread(target=follow)
        reader.start()
        deadline = time.monotonic() + 10  # a loaded machine may take a while to send the first
        while not frames:
            assert time.monotonic() < deadline, "the stats stream sent nothing"
            time.sleep(0.02)
        close_streams(engine)
        reader.join(3)
        assert not reader.is_alive()
        assert StatsSnapshot.model_validate_json(frames[0].data).model.state == "unloaded"
    finally:
        server.stop()


# --- opt-in per-request timings in the final usage ----------------------------------------


def _post(served: Served, stream: bool, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "m", "max_tokens": 3, "messages": HI, "stream": stream}
    return httpx.post(
        served.server.url + "/v1/messages", json=body, headers={**AUTH, **headers}, timeout=30
    )


def _final_usage(response: httpx.Response, stream: bool) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    if not stream:
        return dict(response.json()["usage"])
    deltas = [f.json() for f in parse_frames(response.text) if f.event == "message_delta"]
    assert len(deltas) == 1
    return dict(deltas[0]["usage"])


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_timings_in_the_final_usage_only_when_asked(served: Served, stream: bool) -> None:
    plain_usage = _final_usage(_post(served, stream, {}), stream)
    assert set(plain_usage) == {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
    timed = _final_usage(_post(served, stream, {"x-mlx-timings": "1"}), stream)
    timings = timed.pop("mlx_timings")
    assert set(timed) == set(plain_usage)
    assert set(timings) == {"queue_s", "ttft_s", "prefill_tps", "decode_tps"}
    assert timings["ttft_s"] > 0 and timings["prefill_tps"] > 0 and timings["queue_s"] >= 0
    assert timed["output_tokens"] >= 1


@pytest.mark.slow
def test_the_sdk_reads_a_timed_response(served: Served) -> None:
    client = anthropic.Anthropic(
        base_url=served.server.url,
        api_key=TOKEN,
        max_retries=0,
        default_headers={"x-mlx-timings": "1"},
    )
    with client.messages.stream(model="m", max_tokens=3, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens >= 1
