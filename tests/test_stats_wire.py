"""The stats snapshot is one wire type: the engine's stats reach `/v1/stats` whole, validate
strictly as `StatsSnapshot`, and `/metrics` says the same numbers.

A field added to the engine's stats or to the wire type alone fails here: the engine's leaves
must all reach the wire (by name, or through `ENGINE_TO_WIRE` where the wire groups them), the
mapping must set every wire field, and the server must send every field and nothing else.
Each check runs on stats recorded by hand (quick) and on a real tiny engine's (slow).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.testclient import TestClient

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.stats import (
    MAX_SESSIONS,
    CacheFigures,
    EngineCounters,
    EngineStats,
    MissDigests,
    MissExcerpts,
    MissRecord,
    RequestRecord,
    StatsBook,
)
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.protocol.stats import StatsSnapshot
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.metrics import MODEL_STATES
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.server.stats_routes import stats_routes
from mlxlaunch.server.stats_snapshot import stats_snapshot

TOKEN = "wire-token"
AUTH = {"x-api-key": TOKEN}
SYSTEM = "You are a coding agent. Read files, run commands and fix bugs. " + (
    "Answer briefly and cite the files you read. " * 12
)
MODEL_PATH = "/Users/someone/models/mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit"

# Engine fields that the wire groups under another name; every other leaf keeps its path.
ENGINE_TO_WIRE = {
    "model": "model.name",  # a name, not the path (checked apart)
    "state": "model.state",
    "memory_active_bytes": "memory.active_bytes",
    "memory_cache_bytes": "memory.cache_bytes",
    "memory_limit_bytes": "memory.limit_bytes",
    "cache_hit_ratio": "cache.hit_ratio",
    "kv_cache_bytes": "memory.kv_cache_bytes",
    "kv_running_bytes": "memory.kv_running_bytes",
    "kv_bits": "memory.kv_bits",
}
WIRE_ONLY = {"version", "time", "uptime_s"}  # the server's own
# The id a model of several is listed under: it becomes that model's `model.name`.
ENGINE_ONLY = {"listed_as"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def recorded_stats() -> EngineStats:
    """Engine stats with every figure set, as a busy engine's could be (no model needed)."""
    book = StatsBook(lambda: 100.0)
    book.model, book.state = MODEL_PATH, "loaded"
    book.queue_depth, book.running, book.queued_tokens = 1, 2, 9_870
    book.memory_active_bytes, book.memory_cache_bytes = 18_340_000_000, 1_200_000_000
    book.memory_limit_bytes = 30_000_000_000
    book.kv_running_bytes, book.kv_bits = 700_000_000, 8
    book.count(**{f.name: i + 1 for i, f in enumerate(dataclasses.fields(EngineCounters))})
    book.step(prompt_tokens=3_280, prompt_s=1.0, gen_tokens=229, decode_s=2.0)
    for i, outcome in enumerate(("end_turn", "tool_use")):
        book.record(
            RequestRecord(f"msg_{i}", "main", "claude-x", 900, 512, 40, 1.25, 39.5, outcome)
        )
    miss = MissRecord(
        "msg_1",
        "subagent",
        812,
        9_870,
        21_904,
        812,
        MissDigests("0a1b2c3d", "4e5f6a7b", "8c9d0e1f"),
        MissExcerpts("fix ", "bugs in", "find it"),  # as an engine under --debug-cache keeps
    )
    sizes = {
        f.name: i + 1 for i, f in enumerate(dataclasses.fields(CacheFigures)) if f.type == "int"
    }
    book.cache = CacheFigures(**sizes, warning="snapshots only", last_miss=miss)
    return book.snapshot()


class Frozen:
    """An engine whose stats stay as they were once read (so every route sees the same)."""

    def __init__(self, stats: EngineStats) -> None:
        self._stats = stats

    def stats(self) -> EngineStats:
        return self._stats


def client_over(stats: EngineStats, **options: Any) -> TestClient:
    """The stats routes alone, unguarded, over `stats`."""
    routes = stats_routes(Frozen(stats), lambda handler: handler, **options)
    return TestClient(Starlette(routes=routes))


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar in a stats dataclass or wire model."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, BaseModel):
        items = [(name, getattr(value, name)) for name in type(value).model_fields]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        yield ".".join(path), value
        return
    for name, item in items:
        yield from leaves(item, (*path, name))


def unset_fields(model: BaseModel, path: str = "") -> list[str]:
    """Wire fields the mapping left at their defaults instead of setting them."""
    missing = [
        f"{path}{name}" for name in type(model).model_fields if name not in model.model_fields_set
    ]
    for name in type(model).model_fields:
        value = getattr(model, name)
        children = value if isinstance(value, tuple) else (value,)
        for i, child in enumerate(children):
            if isinstance(child, BaseModel):
                where = f"{path}{name}.{i}." if isinstance(value, tuple) else f"{path}{name}."
                missing += unset_fields(child, where)
    return missing


def check_sent_whole(body: str) -> StatsSnapshot:
    """`body` is a snapshot with every field of the wire type and no other."""
    snap = StatsSnapshot.model_validate_json(body, strict=True, extra="forbid")
    assert snap.model_dump(mode="json") == json.loads(body)  # no default filled in, none dropped
    return snap


def check_reaches_wire(stats: EngineStats) -> None:
    """Every engine figure lands in the wire type, and the mapping sets every wire field."""
    snap = stats_snapshot(stats, now=time.time(), started_at=0.0, excerpts=True)
    assert unset_fields(snap) == []
    engine = {
        ENGINE_TO_WIRE.get(path, path): value
        for path, value in leaves(stats)
        if path not in ENGINE_ONLY
    }
    wire = {path: value for path, value in leaves(snap) if path not in WIRE_ONLY}
    assert wire.pop("model.name") == plain_model_id(str(engine.pop("model.name")))
    assert wire == engine


def _samples(text: str) -> Samples:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def _counter_sample(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    if name == "requests_admitted":
        return "mlxlaunch_requests_admitted_total", ()
    if name.startswith("requests_"):
        return "mlxlaunch_requests_total", (("outcome", name.removeprefix("requests_")),)
    renamed = {"cached_tokens": "cached_prompt_tokens"}
    return f"mlxlaunch_{renamed.get(name, name)}_total", ()


def check_metrics_equal_snapshot(stats: EngineStats) -> None:
    """`/metrics` exports the very figures `/v1/stats` gives for the same stats."""
    with client_over(stats) as client:
        snap = StatsSnapshot.model_validate_json(client.get("/v1/stats").text)
        scrape = _samples(client.get("/metrics").text)
    expected: Samples = {
        _counter_sample(name): value for name, value in snap.counters.model_dump().items()
    }
    expected |= {
        ("mlxlaunch_queue_depth", ()): snap.queue_depth,
        ("mlxlaunch_requests_running", ()): snap.running,
        ("mlxlaunch_prefill_tokens_per_second", ()): snap.prefill_tps,
        ("mlxlaunch_decode_tokens_per_second", ()): snap.decode_tps,
        ("mlxlaunch_prefix_cache_bytes", ()): snap.cache.bytes,
        ("mlxlaunch_prefix_cache_disk_bytes", ()): snap.cache.disk_bytes,
        ("mlxlaunch_prefix_cache_hit_ratio", ()): snap.cache.hit_ratio,
        ("mlxlaunch_memory_active_bytes", ()): snap.memory.active_bytes,
        ("mlxlaunch_memory_cache_bytes", ()): snap.memory.cache_bytes,
        ("mlxlaunch_model_info", (("model", snap.model.name or ""),)): 1.0,
    }
    expected |= {
        ("mlxlaunch_model_state", (("state", state),)): float(state == snap.model.state)
        for state in MODEL_STATES
    }
    timed = [r for r in snap.recent if r.output_tokens >= 1 and r.ttft_s > 0]
    expected[("mlxlaunch_time_to_first_token_seconds_count", ())] = len(timed)
    expected[("mlxlaunch_time_to_first_token_seconds_sum", ())] = sum(r.ttft_s for r in timed)
    assert timed and snap.counters.requests_completed > 0  # real figures, not zeros
    assert {key: scrape.get(key) for key in expected} == pytest.approx(expected)


# --- on recorded stats (quick) -------------------------------------------------------------------


def test_recorded_stats_are_sent_whole_and_every_figure_reaches_the_wire() -> None:
    stats = recorded_stats()
    with client_over(stats) as client:
        snap = check_sent_whole(client.get("/v1/stats").text)
    assert snap.prefill_tps == 3_280.0 and snap.recent[1].outcome == "tool_use"
    check_reaches_wire(stats)


def test_recorded_stats_metrics_equal_the_snapshots() -> None:
    check_metrics_equal_snapshot(recorded_stats())


def test_the_model_shows_by_name_and_prompt_text_only_when_shared() -> None:
    with client_over(recorded_stats()) as client:
        body, metrics = client.get("/v1/stats").text, client.get("/metrics").text
    snap = StatsSnapshot.model_validate_json(body)
    assert snap.model.name == "Qwen3-Coder-30B-A3B-Instruct-4bit"
    assert "/Users/someone" not in body and "/Users/someone" not in metrics
    assert snap.cache.last_miss is not None and snap.cache.last_miss.excerpts is None
    assert "bugs in" not in body and "find it" not in body
    assert snap.cache.last_miss.digests.request == "8c9d0e1f"  # sent whatever the setting

    with client_over(recorded_stats(), model_id="qwen-coder", excerpts=True) as client:
        shared = StatsSnapshot.model_validate_json(client.get("/v1/stats").text)
    assert shared.model.name == "qwen-coder"
    assert shared.cache.last_miss is not None and shared.cache.last_miss.excerpts is not None
    assert shared.cache.last_miss.excerpts.request == "find it"


# --- on a real tiny engine (slow) ----------------------------------------------------------------


@dataclass
class Served:
    engine: Engine
    server: ServerHandle
    model_dir: Path

    def get(self, path: str) -> httpx.Response:
        response = httpx.get(self.server.url + path, headers=AUTH, timeout=30)
        assert response.status_code == 200, response.text
        return response


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    """A server whose engine has finished requests and reported a cache miss."""
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    engine.start()
    server = start_server(engine, ServerSettings(auth_token=TOKEN))
    try:
        client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)
        for system in (SYSTEM, SYSTEM.replace("fix bugs", "find bugs", 1)):
            client.messages.create(
                model="claude-x",
                max_tokens=2,
                system=system,
                messages=[{"role": "user", "content": "Fix the failing test."}],
                extra_headers={"x-claude-code-session-id": "session-7"},
            )
        stats = engine.stats()
        assert stats.recent and stats.cache.last_miss is not None, "no miss to carry"
        yield Served(engine, server, tiny_model_dir)
    finally:
        server.stop(timeout=2)
        engine.close()


@pytest.mark.slow
def test_v1_stats_of_a_real_engine_is_sent_whole(served: Served) -> None:
    snap = check_sent_whole(served.get("/v1/stats").text)
    assert snap.recent and snap.cache.last_miss is not None
    assert snap.model.state == "loaded" and snap.counters.requests_completed >= 2


@pytest.mark.slow
def test_an_agent_sessions_turns_and_its_latest_miss_are_in_the_stats(served: Served) -> None:
    """Two turns of one Claude Code session (its header), the second's system prompt changed:
    the session has both turns and the second as its miss, the server's latest miss."""
    snap = check_sent_whole(served.get("/v1/stats").text)
    [session] = snap.sessions
    assert (session.key, session.turns) == ("session-7", 2)
    assert session.miss_turn == 2 and session.miss_reuse == "partial"
    assert session.miss_request_id == snap.cache.last_miss.request_id  # type: ignore[union-attr]
    assert session.last_request_id == snap.recent[-1].request_id
    assert [r.cache_reuse for r in snap.recent] == ["fresh", "partial"]


def test_a_session_keeps_its_latest_miss_and_the_book_keeps_the_latest_sessions() -> None:
    book = StatsBook(lambda: 0.0)

    def turn(key: str, n: int, reuse: str, cached: int = 0) -> None:
        book.record(RequestRecord(f"{key}-{n}", "main", "m", 1000 * n, cached, 1, 0.5, 9.0,
                                  "end_turn", cache_key=key, cache_reuse=reuse))  # fmt: skip

    turn("a", 1, "fresh")  # a first turn is no miss
    turn("a", 2, "prefix_hit", 990)
    turn("a", 3, "partial", 1200)
    turn("a", 4, "prefix_hit", 3990)
    turn("", 1, "fresh")  # no key: no session
    [a] = book.snapshot().sessions
    assert (a.turns, a.prompt_tokens, a.cached_tokens) == (4, 10_000, 6180)
    assert (a.miss_turn, a.miss_request_id, a.miss_cached_tokens) == (3, "a-3", 1200)
    assert (a.last_request_id, a.last_cached_tokens) == ("a-4", 3990)
    turn("b", 1, "fresh")
    turn("b", 2, "fresh")  # nothing reused after its first turn: a miss
    assert [s.key for s in book.snapshot().sessions] == ["b", "a"]  # the latest active first
    assert book.snapshot().sessions[0].miss_reuse == "fresh"
    for i in range(MAX_SESSIONS):
        turn(f"k{i}", 1, "fresh")
    keys = [s.key for s in book.snapshot().sessions]
    assert len(keys) == MAX_SESSIONS and "a" not in keys and "b" not in keys


@pytest.mark.slow
def test_every_figure_of_a_real_engine_reaches_the_wire(served: Served) -> None:
    check_reaches_wire(served.engine.stats())


@pytest.mark.slow
def test_metrics_of_a_real_engine_equal_its_snapshots(served: Served) -> None:
    check_metrics_equal_snapshot(served.engine.stats())


@pytest.mark.slow
def test_a_real_server_shows_the_model_by_name_and_no_prompt_text(served: Served) -> None:
    body = served.get("/v1/stats").text
    snap = StatsSnapshot.model_validate_json(body)
    assert snap.model.name == served.model_dir.name
    assert str(served.model_dir) not in body
    assert str(served.model_dir) not in served.get("/metrics").text
    miss = snap.cache.last_miss
    assert miss is not None and miss.excerpts is None
    assert miss.digests.cached and miss.digests.cached != miss.digests.request
    for text in ("coding agent", "fix", "find", "Answer briefly"):
        assert text not in body


@pytest.mark.slow
def test_sharing_excerpts_needs_an_engine_that_kept_them(served: Served) -> None:
    # The server may share excerpts, but an engine without debug_cache kept none.
    settings = ServerSettings(auth_token=TOKEN, model_id="qwen-coder", stats_prompt_excerpts=True)
    other = start_server(served.engine, settings)
    try:
        body = httpx.get(other.url + "/v1/stats", headers=AUTH, timeout=30).text
    finally:
        other.stop(timeout=2)
    snap = check_sent_whole(body)
    assert snap.model.name == "qwen-coder"
    assert served.engine.stats().cache.last_miss is not None
    assert snap.cache.last_miss is not None and snap.cache.last_miss.excerpts is None
    assert "fix" not in body and "find" not in body
