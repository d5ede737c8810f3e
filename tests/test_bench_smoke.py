"""`mlx bench --quick --model tiny` end to end: both real servers, every workload (concurrency
in rounds, speculative decoding), the JSON and the chart, the restart of both servers as new
processes. Checks that the output is complete, never how fast anything was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlxlaunch.bench.summary import WORKLOADS

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

REPORT_FIELDS = {
    "schema", "date", "elapsed_s", "config", "machine", "model", "targets", "ours", "peer",
    "workloads", "summary", "warnings",
}  # fmt: skip
MACHINE_FIELDS = {"blas", "mlx", "mlx_lm", "device", "backend", "cpu_count", "memory_bytes"}
WORKLOAD_FIELDS = {"agent_session", "new_session", "concurrency", "decode", "prefill_floor"}
TIMING_FIELDS = {"ttft_s", "total_s", "prompt_tokens", "cached_tokens", "output_tokens"}


def test_quick_bench_prints_the_table_and_writes_a_complete_report(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "results"
    command = [
        sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()",
        "bench", "--quick", "--model", "tiny", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for workload in WORKLOADS:
        assert workload in done.stdout
    assert "mlxlaunch" in done.stdout and "mlx_lm.server" in done.stdout

    [json_path] = out.glob("*.json")
    report = json.loads(json_path.read_text())
    assert report.keys() >= REPORT_FIELDS
    assert report["machine"].keys() >= MACHINE_FIELDS
    assert report["machine"]["blas"]
    assert report["peer"] == "mlx_lm.server" and report["warnings"] == []
    assert report["workloads"].keys() >= WORKLOAD_FIELDS
    config = report["config"]
    turns = report["workloads"]["agent_session"]
    assert [t["turn"] for t in turns] == list(range(1, config["turns"] + 1))
    for turn in turns:
        for name in ("mlxlaunch", "mlx_lm.server"):
            timing = turn["results"][name]
            assert timing.keys() >= TIMING_FIELDS
            assert timing["error"] is None and timing["ttft_s"] is not None
    levels = [c["streams"] for c in report["workloads"]["concurrency"]]
    assert levels == config["concurrency"]
    floors = report["workloads"]["prefill_floor"]
    assert len(floors) == 1 + config["turns"] + config["warm_sessions"] + 1
    assert floors[-1]["label"] == "restart"
    assert {row["workload"].split(" ")[0] for row in report["summary"]} >= {
        "agent-session", "new-session", "restart", "concurrency", "decode", "prefill",
    }  # fmt: skip

    # Restart: both servers came back as new processes; ours found the saved prefix.
    restart = report["workloads"]["restart"]
    assert restart.keys() == {"mlxlaunch", "mlx_lm.server"}
    for timing in restart.values():
        assert timing["error"] is None and timing["ttft_s"] is not None
        assert timing["sent_s"] >= config["restart_wait_s"] and timing["ready_s"] > 0
    assert restart["mlxlaunch"]["cached_tokens"] > 0.5 * restart["mlxlaunch"]["prompt_tokens"]
    [restart_row] = [r for r in report["summary"] if r["metric"] == "new session TTFT"]
    assert restart_row["limit"] == floors[-1]["seconds"] and restart_row["speedup"] is not None
    assert "floor" in restart_row["notes"]["mlxlaunch"]

    # Concurrency: wall time of every level on both servers, with prompts of the asked size.
    walls = [r for r in report["summary"] if r["metric"] == "wall time, all streams"]
    assert [r["workload"] for r in walls] == [f"concurrency {k}" for k in levels]
    assert all(r["speedup"] is not None for r in walls)
    for level in report["workloads"]["concurrency"]:
        for run in level["results"].values():
            assert len(run["streams"]) == level["streams"]
            for stream in run["streams"]:
                assert 0 < stream["output_tokens"] <= config["concurrency_tokens"]
                assert 0.7 < stream["prompt_tokens"] / config["concurrency_prompt_tokens"] < 1.3

    # Every level ran in rounds, the server that goes first alternating; each round's ratio
    # is in the aggregate row.
    for level in report["workloads"]["concurrency"]:
        assert len(level["rounds"]) == config["concurrency_rounds"] == 3
        assert len({r["first"] for r in level["rounds"]}) == 2
    aggregates = [r for r in report["summary"] if r["metric"] == "aggregate tokens/s"]
    assert all(len(r["round_speedups"]) == 3 and "slow_rounds" in r for r in aggregates)

    # Speculative decoding: auto beside off on both workloads, the peer's draft model on copy.
    speculative = report["workloads"]["speculative"]
    assert [w["workload"] for w in speculative["workloads"]] == ["copy", "no-copy"]
    rows = {(r["workload"], r["streams"], r["server"]): r for r in speculative["summary"]}
    for streams in config["speculative_streams"]:
        assert rows[("copy", streams, "mlxlaunch --speculate auto")]["drafted_tokens"] > 0
        assert rows[("copy", streams, "mlx_lm.server --draft-model")]["decode_tokens_per_s"]
        assert rows[("no-copy", streams, "mlxlaunch --speculate off")]["tokens_per_step"] == 1
    assert "speculative decoding" in done.stdout and "tokens/step" in done.stdout

    [table] = out.glob("*.md")
    text = table.read_text()
    assert "| workload | metric | mlxlaunch | mlx_lm.server | ratio | limit |" in text
    assert (
        "**Speculative decoding**" in text and "| copy | 1 | mlxlaunch --speculate auto |" in text
    )

    [chart] = out.glob("*.svg")
    assert ET.fromstring(chart.read_text()).tag.endswith("svg")
