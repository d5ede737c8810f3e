"""Report pieces: BLAS description, summary rows, table and chart, from made-up raw figures."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from mlxlaunch.bench.chart import line_chart_svg, turn_ttft_svg
from mlxlaunch.bench.report import (
    LIMITS_ON_CPU,
    QUICK_RUN,
    caveats,
    format_value,
    markdown_table,
    render_table,
)
from mlxlaunch.bench.summary import WORKLOADS, concurrency_figures, summary_rows, workload_of

OURS, PEER = "mlxlaunch", "mlx_lm.server"


def _timing(ttft: float, tokens: int = 4, cached: int = 0, prompt: int = 100) -> dict:
    times = [ttft + 0.01 * i for i in range(tokens)]
    return {
        "ttft_s": ttft, "total_s": times[-1] + 0.001, "prompt_tokens": prompt,
        "cached_tokens": cached, "output_tokens": tokens, "token_times_s": times, "error": None,
        "tokens_per_s": tokens / (times[-1] + 0.001),
    }  # fmt: skip


def _raw() -> tuple[dict, dict]:
    both = lambda ours, peer: {OURS: ours, PEER: peer}  # noqa: E731
    servers = {
        "targets": [OURS, PEER],
        "warmup": both(_timing(0.1), _timing(0.1)),
        "new_session": {
            "cold": both(_timing(2.0), _timing(3.0)),
            "warm": [both(_timing(0.2, cached=90), _timing(0.4, cached=80))],
        },
        "agent_session": [
            {"turn": k, "results": both(_timing(0.1 * k, cached=90), _timing(0.2 * k))}
            for k in (1, 2, 3)
        ],
        "decode": [both(_timing(0.01, 32), _timing(0.02, 32))],
        "concurrency": [
            {
                "streams": k,
                "results": both(
                    {"wall_s": 1.0, "streams": [_timing(0.1, 10) for _ in range(k)]},
                    {"wall_s": 2.0, "streams": [_timing(0.2, 10) for _ in range(k)]},
                ),
            }
            for k in (1, 2)
        ],
        "restart": both(
            dict(_timing(0.06, cached=95), ready_s=1.5, sent_s=3.0),
            dict(_timing(0.6), ready_s=1.2, sent_s=3.0),
        ),
    }
    limits = {
        "prefill_floor": [
            {
                "label": label,
                "prompt_tokens": 100,
                "reused_tokens": 50,
                "new_tokens": 50,
                "seconds": 0.05,
            }
            for label in ("cold", "turn 1", "turn 2", "turn 3", "warm 1", "restart")
        ],
        "decode_ceiling": [{"token_times_s": [0.01 * i for i in range(32)], "tokens_per_s": 99.0}],
    }
    return servers, limits


def test_summary_has_every_workload_with_both_servers_and_ratios() -> None:
    servers, limits = _raw()
    rows = summary_rows(servers, limits)
    assert {workload_of(r) for r in rows} == set(WORKLOADS)
    order = [WORKLOADS.index(workload_of(r)) for r in rows]
    assert order == sorted(order)
    cold = next(r for r in rows if r.metric == "cold TTFT")
    assert cold.values == {OURS: 2.0, PEER: 3.0}
    assert cold.speedup(OURS, PEER) == 1.5 and cold.limit == 0.05
    turn_rows = [r for r in rows if r.workload == "agent-session" and r.metric.startswith("turn ")]
    assert len(turn_rows) == 3 and "90/100 cached" in turn_rows[0].notes[OURS]
    aggregate = next(r for r in rows if r.workload == "concurrency 2" and "aggregate" in r.metric)
    assert aggregate.values == {OURS: 20.0, PEER: 10.0} and aggregate.speedup(OURS, PEER) == 2.0
    itl = next(r for r in rows if r.metric == "inter-token p50")
    assert itl.speedup(OURS, PEER) is None  # burst delivery makes a ratio meaningless


def test_restart_row_compares_both_servers_with_the_floor_of_the_new_tokens() -> None:
    servers, limits = _raw()
    rows = summary_rows(servers, limits)
    ttft = next(r for r in rows if r.workload == "restart" and r.metric == "new session TTFT")
    assert ttft.values == {OURS: 0.06, PEER: 0.6} and ttft.limit == 0.05
    assert ttft.speedup(OURS, PEER) == pytest.approx(10.0)
    assert ttft.notes[OURS] == "95/100 cached, 1.20× floor"
    ready = next(r for r in rows if r.workload == "restart" and r.metric == "ready after start")
    assert ready.values == {OURS: 1.5, PEER: 1.2} and ready.speedup(OURS, PEER) is None
    del servers["restart"]  # a run without the restart workload (--no-restart, or --url)
    assert not any(r.workload == "restart" for r in summary_rows(servers, limits))


def test_concurrency_reports_wall_time_and_stream_sizes() -> None:
    servers, limits = _raw()
    rows = summary_rows(servers, limits)
    wall = next(r for r in rows if r.workload == "concurrency 2" and r.metric.startswith("wall"))
    assert wall.values == {OURS: 1.0, PEER: 2.0} and wall.speedup(OURS, PEER) == 2.0
    assert wall.notes[OURS] == "2×100 in, 10 out"


def test_markdown_table_has_the_run_facts_and_a_row_per_summary_row() -> None:
    servers, limits = _raw()
    rows = summary_rows(servers, limits)
    report = {
        "date": "2026-11-29T10:00:00+00:00", "ours": OURS, "peer": PEER,
        "model": {"name": "medium"},
        "machine": {"blas": "openblas", "device": "cpu", "machine": "x86_64", "cpu_count": 2,
                    "memory_bytes": 2 * 1024**3, "mlx": "0.32.4", "mlx_lm": "0.32.2"},
    }  # fmt: skip
    text = markdown_table(report, rows)
    head, _, rest = text.partition("\n\n")
    assert "2026-11-29" in head and "`medium`" in head and "openblas" in head
    note, _, table = rest.partition("\n\n")
    assert note == LIMITS_ON_CPU  # a CPU run says why its limits can be beaten
    lines = table.strip().splitlines()
    assert lines[0] == f"| workload | metric | {OURS} | {PEER} | ratio | limit |"
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == 7 for line in lines)
    assert "| cold TTFT | 2.00 s (0/100 cached) | 3.00 s (0/100 cached) | 1.50× | 50 ms |" in text
    assert "| restart | new session TTFT | 60 ms (95/100 cached, 1.20× floor) |" in text


def test_concurrency_counts_failures() -> None:
    failed = dict(_timing(0.1), error="HTTP 429")
    figures = concurrency_figures({"wall_s": 1.0, "streams": [_timing(0.1), failed]})
    assert figures["errors"] == 1 and figures["ttft_s"]["n"] == 2


def test_table_shows_every_workload_and_ratio() -> None:
    servers, limits = _raw()
    console = Console(width=200, record=True)
    console.print(render_table(summary_rows(servers, limits), OURS, PEER, "title"))
    text = console.export_text()
    for workload in WORKLOADS:
        assert workload in text
    assert "1.50×" in text and OURS in text and PEER in text


def test_table_without_a_peer_has_no_ratio_column() -> None:
    servers, limits = _raw()
    console = Console(width=200, record=True)
    console.print(render_table(summary_rows(servers, limits), OURS, None, "title"))
    assert "speedup" not in console.export_text()


def test_chart_is_valid_svg_with_a_line_per_server_and_the_floor() -> None:
    servers, limits = _raw()
    svg = turn_ttft_svg(servers, limits, model="tiny")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 3  # ours, peer, floor
    assert all(len(p.get("points", "").split()) == 3 for p in lines)
    legend = [t.text for t in root.findall(f"{ns}text")]
    assert OURS in legend and PEER in legend


def test_chart_leaves_gaps_for_missing_points() -> None:
    svg = line_chart_svg({"a": [1.0, None, 2.0, 3.0]}, title="t", y_label="s")
    assert svg.count("<polyline") == 2


def test_format_value() -> None:
    assert format_value(0.123, "s") == "123 ms"
    assert format_value(2.5, "s") == "2.50 s"
    assert format_value(1234.0, "tok/s") == "1234 tok/s"
    assert format_value(None, "s") == "—"


def test_caveats_name_a_quick_run_and_every_row_the_peer_won() -> None:
    servers, limits = _raw()
    rows = summary_rows(servers, limits)
    lost = [r for r in rows if r.values and (x := r.speedup(OURS, PEER)) is not None and x < 0.95]
    notes = caveats(rows, OURS, PEER, quick=True)
    assert notes[0] == QUICK_RUN
    if lost:
        assert all(f"{r.workload} {r.metric}" in notes[-1] for r in lost)
    # Make ours lose the cold row: the caveat must say so.
    cold = next(r for r in rows if r.metric == "cold TTFT")
    cold.values[OURS] = 6.0
    named = caveats(rows, OURS, PEER, quick=False)[-1]
    assert named.startswith(f"{PEER} was faster") and "cold TTFT (0.50×)" in named
    assert caveats(rows, OURS, None, quick=False) == []
