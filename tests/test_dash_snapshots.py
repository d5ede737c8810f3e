"""Snapshot tests of the dashboard's screens, fed recorded stats (no server, fixed size)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from mlxlaunch.dash.app import DashApp
from mlxlaunch.protocol.stats import STATS_VERSION, StatsSnapshot

SIZE = (110, 36)
Compare = Callable[..., bool]

# A server snapshot as `GET /v1/stats` returns it, recorded from a Claude Code-like session.
RECORDED: dict[str, Any] = {
    "version": STATS_VERSION,
    "time": 1_767_225_600.0,
    "uptime_s": 754.0,
    "model": {"name": "Qwen3-Coder-30B-A3B-Instruct-4bit", "state": "loaded"},
    "queue_depth": 1,
    "queued_tokens": 9_870,
    "running": 2,
    "prefill_tps": 0.0,
    "decode_tps": 0.0,
    "memory": {
        "active_bytes": 18_340_000_000,
        "cache_bytes": 1_200_000_000,
        "limit_bytes": 0,
        "kv_cache_bytes": 2_150_000_000,
        "kv_running_bytes": 640_000_000,
        "kv_bits": 8,
    },
    "counters": {
        "requests_admitted": 14,
        "requests_refused": 2,
        "requests_overloaded": 2,
        "requests_cancelled": 1,
        "requests_deduplicated": 0,
        "requests_failed": 0,
        "requests_completed": 11,
        "prompt_tokens": 268_410,
        "cached_tokens": 231_077,
        "generated_tokens": 5_120,
        "idle_cache_clears": 0,
        "idle_unloads": 0,
        "drafted_tokens": 1_950,
        "accepted_tokens": 1_512,
    },
    "cache": {
        "hit_ratio": 0.861,
        "bytes": 2_450_000_000,
        "budget_bytes": 8_000_000_000,
        "blocks": 412,
        "evictions": 0,
        "lookups": 14,
        "hits": 10,
        "disk_bytes": 0,
        "disk_entries": 0,
        "disk_loads": 0,
        "disk_saves": 0,
        "disk_rejected": 0,
        "warning": None,
        "last_miss": {
            "request_id": "msg_0103abcdef",
            "kind": "subagent",
            "position": 1_024,
            "request_tokens": 9_870,
            "nearest_tokens": 21_904,
            "cached_tokens": 1_024,
            "digests": {"before": "5e0c81a2", "cached": "b7d4f019", "request": "2c96e3d8"},
            "excerpts": None,
        },
    },
    "recent": [
        {
            "request_id": f"msg_01{i:02d}abcdef",
            "kind": kind,
            "model_alias": alias,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "output_tokens": output,
            "ttft_s": ttft,
            "decode_tps": tps,
            "outcome": outcome,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "cache_key": "c22fbc83-1f43" if kind == "main" else "",
            "cache_reuse": "prefix_hit" if cached else "fresh",
        }
        for i, (kind, alias, prompt, cached, output, ttft, tps, outcome, drafted, accepted) in (
            enumerate(
                [
                    ("title", "claude-haiku-4-5", 412, 0, 12, 0.31, 48.2, "end_turn", 0, 0),
                    ("main", "claude-sonnet-4-5", 21_904, 0, 388, 24.6, 41.0, "tool_use", 420, 351),
                    (
                        "main",
                        "claude-sonnet-4-5",
                        22_512,
                        21_890,
                        95,
                        1.12,
                        40.4,
                        "tool_use",
                        64,
                        20,
                    ),
                    ("subagent", "claude-sonnet-4-5", 9_870, 0, 640, 9.8, 39.1, "end_turn", 0, 0),
                    (
                        "main",
                        "claude-sonnet-4-5",
                        23_101,
                        22_498,
                        211,
                        1.40,
                        40.9,
                        "cancelled",
                        8,
                        1,
                    ),
                ]
            )
        )
    ],
    "sessions": [
        {
            "key": "c22fbc83-1f43",
            "turns": 3,
            "prompt_tokens": 67_517,
            "cached_tokens": 44_388,
            "last_request_id": "msg_0104abcdef",
            "last_prompt_tokens": 23_101,
            "last_cached_tokens": 22_498,
            "last_ttft_s": 1.40,
            "miss_turn": 0,
            "miss_request_id": "",
            "miss_prompt_tokens": 0,
            "miss_cached_tokens": 0,
            "miss_reuse": "",
        },
        {
            "key": "9d1e0b7a-codex",
            "turns": 7,
            "prompt_tokens": 58_240,
            "cached_tokens": 41_003,
            "last_request_id": "msg_0103abcdef",
            "last_prompt_tokens": 9_870,
            "last_cached_tokens": 1_024,
            "last_ttft_s": 9.8,
            "miss_turn": 7,
            "miss_request_id": "msg_0103abcdef",
            "miss_prompt_tokens": 9_870,
            "miss_cached_tokens": 1_024,
            "miss_reuse": "partial",
        },
    ],
    "role": "main",
    "failure": None,
    "models": [],
}


def recorded(step: int) -> StatsSnapshot:
    """The recorded snapshot at second `step`: speeds rise and fall as requests come and go."""
    data = copy.deepcopy(RECORDED)
    data["prefill_tps"] = float((step * 97) % 1_400)
    data["decode_tps"] = 30.0 + (step * 7) % 13
    # Every field, and no other, as the server sends it (tests/test_stats_wire.py).
    snap = StatsSnapshot.model_validate_json(json.dumps(data), strict=True, extra="forbid")
    assert snap.model_dump(mode="json") == data
    return snap


async def feed(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, DashApp)
    for step in range(60):
        app.show(recorded(step))
    await pilot.pause()


def test_main_screen(snap_compare: Compare) -> None:
    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=feed)


def test_main_screen_light_theme(snap_compare: Compare) -> None:
    async def light(pilot: Pilot[None]) -> None:
        pilot.app.theme = "textual-light"
        await feed(pilot)

    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=light)


def test_cache_miss_panel(snap_compare: Compare) -> None:
    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=feed, press=["3"])


def test_sessions_panel(snap_compare: Compare) -> None:
    """Each agent session's turns and reuse, and its latest miss explained where the server's
    latest miss is that session's (the Codex session's here)."""
    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=feed, press=["2"])


def test_server_gone_and_paused(snap_compare: Compare) -> None:
    async def gone(pilot: Pilot[None]) -> None:
        await feed(pilot)
        app = pilot.app
        assert isinstance(app, DashApp)
        app.show_gone("the server is not running (connection refused)")
        await pilot.pause()

    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=gone, press=["p"])
