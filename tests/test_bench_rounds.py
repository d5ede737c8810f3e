"""Concurrency in rounds: each level runs several times, the server that goes first alternating;
the report gives each server's median with the range, the median of the per-round ratios with
theirs, and marks a round below 0.8×, so a stall shows instead of averaging away. Made-up
figures and fake targets, no model; no time is asserted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bench_helpers import CountingProgress
from rich.console import Console

from mlxlaunch.bench.clients import StreamTiming
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.report import caveats, markdown_table, ratio_cell, render_table
from mlxlaunch.bench.rows import SLOW_ROUND_RATIO, SummaryRow
from mlxlaunch.bench.runner import measure_servers, order_of, server_steps
from mlxlaunch.bench.summary import summary_rows
from mlxlaunch.bench.workloads import Conversation

OURS, PEER = "mlxlaunch", "mlx_lm.server"


def _stream(tokens: int = 10) -> dict[str, Any]:
    times = [0.1 + 0.01 * i for i in range(tokens)]
    return {
        "ttft_s": 0.1, "total_s": times[-1], "prompt_tokens": 100, "cached_tokens": 0,
        "output_tokens": tokens, "token_times_s": times, "error": None,
    }  # fmt: skip


def _run(wall: float, streams: int = 2) -> dict[str, Any]:
    return {"wall_s": wall, "streams": [_stream() for _ in range(streams)]}


def _servers(ours_walls: list[float], peer_walls: list[float]) -> dict[str, Any]:
    """Raw figures with one concurrency level (2 streams of 10 tokens) in rounds."""
    rounds = [
        {"round": n, "first": OURS if n % 2 else PEER, "results": {OURS: _run(a), PEER: _run(b)}}
        for n, (a, b) in enumerate(zip(ours_walls, peer_walls, strict=True), start=1)
    ]
    level = {"streams": 2, "results": rounds[0]["results"], "rounds": rounds}
    both = {OURS: _stream(), PEER: _stream()}
    return {
        "targets": [OURS, PEER],
        "new_session": {"cold": both, "warm": [both]},
        "agent_session": [{"turn": 1, "results": both}],
        "decode": [{n: {**_stream(), "tokens_per_s": 10.0} for n in (OURS, PEER)}],
        "concurrency": [level],
    }


def _rows(servers: dict[str, Any]) -> list[SummaryRow]:
    return summary_rows(servers, {"prefill_floor": [], "decode_ceiling": []})


def _aggregate(servers: dict[str, Any]) -> SummaryRow:
    [row] = [r for r in _rows(servers) if r.metric == "aggregate tokens/s"]
    return row


def test_aggregate_row_has_medians_ranges_and_the_median_of_the_round_ratios() -> None:
    # 20 output tokens per round: aggregate = 20 / wall.
    row = _aggregate(_servers([0.1, 0.2, 0.25], [0.2, 0.2, 0.2]))
    assert row.rounds == {OURS: [200.0, 100.0, 80.0], PEER: [100.0, 100.0, 100.0]}
    assert row.values == {OURS: 100.0, PEER: 100.0}
    assert row.round_speedups(OURS, PEER) == [2.0, 1.0, 0.8]
    assert row.speedup(OURS, PEER) == 1.0  # the median of the per-round ratios
    assert row.notes[OURS] == "median of 3 rounds, 80.0–200"
    assert row.slow_rounds(OURS, PEER) == []  # 0.8× is the mark, not below it


def test_a_stalled_round_is_marked_in_the_table_the_markdown_and_the_notes() -> None:
    row = _aggregate(_servers([0.1, 2.0, 0.1], [0.1, 0.1, 0.1]))  # round 2: 20× slower
    assert row.speedup(OURS, PEER) == 1.0  # the median hides it...
    assert row.slow_rounds(OURS, PEER) == [(2, pytest.approx(0.05))]  # ...the round does not
    assert ratio_cell(row, OURS, PEER, markup=False) == (
        f"1.00× (0.05–1.00); round 2 < {SLOW_ROUND_RATIO}×"
    )
    rows = [r for r in _rows(_servers([0.1, 2.0, 0.1], [0.1, 0.1, 0.1])) if r.rounds]
    console = Console(width=250, record=True)
    console.print(render_table(rows, OURS, PEER, "title"))
    text = console.export_text()
    assert "round 2 < 0.8×" in text and "median of the rounds" in text
    report = {
        "date": "2026-12-02T10:00:00+00:00", "ours": OURS, "peer": PEER,
        "model": {"name": "tiny"},
        "machine": {"blas": "openblas", "device": "gpu", "machine": "arm64", "cpu_count": 8,
                    "memory_bytes": None, "mlx": "0", "mlx_lm": "0"},
    }  # fmt: skip
    assert "round 2 < 0.8×" in markdown_table(report, rows)
    [note] = [n for n in caveats(rows, OURS, PEER, quick=False) if "rounds below" in n]
    assert "concurrency 2 round 2 (0.05×)" in note


def test_several_slow_rounds_are_named_in_one_mark() -> None:
    row = _aggregate(_servers([0.1, 0.4, 0.5], [0.1, 0.1, 0.1]))
    assert ratio_cell(row, OURS, PEER, markup=False).endswith("; rounds 2, 3 < 0.8×")
    [note] = [n for n in caveats([row], OURS, PEER, quick=False) if "rounds below" in n]
    assert "round 2 (0.25×); concurrency 2 round 3 (0.20×)" in note


def test_the_json_row_carries_every_round_and_keeps_the_old_fields() -> None:
    data = _aggregate(_servers([0.1, 0.4], [0.2, 0.2])).as_dict(OURS, PEER)
    assert data["metric"] == "aggregate tokens/s" and data["speedup"] == pytest.approx(1.25)
    assert data["rounds"] == {OURS: [200.0, 50.0], PEER: [100.0, 100.0]}
    assert data["spread"][OURS] == {"min": 50.0, "median": 125.0, "max": 200.0}
    assert data["round_speedups"] == [2.0, 0.5]
    assert data["round_speedup_spread"] == {"min": 0.5, "median": 1.25, "max": 2.0}
    assert data["slow_rounds"] == [2]


def test_a_report_from_before_rounds_reads_as_one_round() -> None:
    servers = _servers([0.1], [0.2])
    del servers["concurrency"][0]["rounds"]
    row = _aggregate(servers)
    assert row.values == {OURS: 200.0, PEER: 100.0} and row.speedup(OURS, PEER) == 2.0
    assert OURS not in row.notes  # no range for one round
    assert "(" not in ratio_cell(row, OURS, PEER, markup=False)


def test_other_concurrency_rows_pool_the_rounds() -> None:
    rows = _rows(_servers([0.1, 0.3, 0.2], [0.2, 0.2, 0.2]))
    wall = next(r for r in rows if r.metric == "wall time, all streams")
    assert wall.values == {OURS: 0.2, PEER: 0.2} and not wall.rounds  # the median round's
    per_stream = next(r for r in rows if r.metric == "per-stream tokens/s p50")
    assert per_stream.values[OURS] == pytest.approx(10 / 0.19)  # over all 6 streams


class _Target:
    """A server that answers at once and records the order it was asked in."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self._log = log

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming:
        self._log.append(self.name)
        return StreamTiming(ttft_s=0.01, token_times=[0.01, 0.02], total_s=0.02, output_tokens=2)

    async def aclose(self) -> None:
        pass


def test_each_level_runs_in_rounds_and_the_first_server_alternates() -> None:
    config = BenchConfig.create(
        quick=True, concurrency=(1, 2), concurrency_rounds=3, codex_session=False
    )
    plan = build_plan(config)
    log: list[str] = []
    targets = [_Target(OURS, log), _Target(PEER, log)]
    progress = CountingProgress()
    figures = asyncio.run(measure_servers(targets, plan, config, progress))  # type: ignore[arg-type]
    assert progress.steps == server_steps(config, 2)  # the progress bar fills exactly
    for level in figures["concurrency"]:
        rounds = level["rounds"]
        assert [r["round"] for r in rounds] == [1, 2, 3]
        assert level["results"] is rounds[0]["results"]
        firsts = [r["first"] for r in rounds]
        assert firsts[0] != firsts[1] != firsts[2]  # alternating
        for r in rounds:
            assert {n: len(run["streams"]) for n, run in r["results"].items()} == {
                OURS: level["streams"], PEER: level["streams"],
            }  # fmt: skip
    # The first of each round's requests went to the server named first.
    level_two = figures["concurrency"][1]["rounds"]
    concurrency_log = log[-2 * 2 * 3 :]
    assert [concurrency_log[4 * i] for i in range(3)] == [r["first"] for r in level_two]


def test_order_rotates_by_one_each_step() -> None:
    a, b, c = (_Target(n, []) for n in "abc")
    assert [t.name for t in order_of([a, b, c], 0)] == ["a", "b", "c"]
    assert [t.name for t in order_of([a, b, c], 1)] == ["b", "c", "a"]
    assert [t.name for t in order_of([a, b], 3)] == ["b", "a"]


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds"):
        BenchConfig.create(concurrency_rounds=0)
    with pytest.raises(ValueError, match="rounds"):
        BenchConfig.create(speculative_rounds=0)
    assert BenchConfig.create(quick=True).concurrency_rounds == 3
