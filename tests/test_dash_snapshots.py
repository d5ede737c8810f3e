"""Snapshot tests of the dashboard's screens, fed recorded stats (no server, fixed size)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from mlxlaunch.dash.app import DashApp
from mlxlaunch.dash.snapshot import StatsSnapshot

SIZE = (110, 36)
Compare = Callable[..., bool]

# A server snapshot as `GET /v1/stats` returns it, recorded from a Claude Code-like session.
RECORDED: dict[str, Any] = {
    "version": 1,
    "model": "/models/mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit",
    "state": "loaded",
    "queue_depth": 1,
    "running": 2,
    "counters": {
        "requests_admitted": 14,
        "requests_refused": 2,
        "requests_cancelled": 1,
        "requests_failed": 0,
        "requests_completed": 11,
        "prompt_tokens": 268_410,
        "cached_tokens": 231_077,
        "generated_tokens": 5_120,
    },
    "memory_active_bytes": 18_340_000_000,
    "memory_cache_bytes": 1_200_000_000,
    "cache": {
        "hit_ratio": 0.861,
        "cached_tokens": 231_077,
        "bytes": 2_450_000_000,
        "disk_bytes": 0,
    },
    "uptime_s": 754.0,
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
        }
        for i, (kind, alias, prompt, cached, output, ttft, tps, outcome) in enumerate(
            [
                ("title", "claude-haiku-4-5", 412, 0, 12, 0.31, 48.2, "end_turn"),
                ("main", "claude-sonnet-4-5", 21_904, 0, 388, 24.6, 41.0, "tool_use"),
                ("main", "claude-sonnet-4-5", 22_512, 21_890, 95, 1.12, 40.4, "tool_use"),
                ("subagent", "claude-sonnet-4-5", 9_870, 0, 640, 9.8, 39.1, "end_turn"),
                ("main", "claude-sonnet-4-5", 23_101, 22_498, 211, 1.40, 40.9, "cancelled"),
            ]
        )
    ],
    "last_miss": {
        "request_id": "msg_0103abcdef",
        "reason": "different system prompt (subagent)",
        "matched_tokens": 1_024,
        "prompt_tokens": 9_870,
        "evicted_bytes": 0,
    },
}


def recorded(step: int) -> StatsSnapshot:
    """The recorded snapshot at second `step`: speeds rise and fall as requests come and go."""
    data = copy.deepcopy(RECORDED)
    data["prefill_tps"] = float((step * 97) % 1_400)
    data["decode_tps"] = 30.0 + (step * 7) % 13
    return StatsSnapshot.from_json(data)


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
    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=feed, press=["2"])


def test_server_gone_and_paused(snap_compare: Compare) -> None:
    async def gone(pilot: Pilot[None]) -> None:
        await feed(pilot)
        app = pilot.app
        assert isinstance(app, DashApp)
        app.show_gone("the server is not running (connection refused)")
        await pilot.pause()

    assert snap_compare(DashApp(), terminal_size=SIZE, run_before=gone, press=["p"])
