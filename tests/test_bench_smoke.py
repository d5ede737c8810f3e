"""`mlx bench --quick --model tiny` end to end: both real servers, every workload, the JSON and
the chart. Checks that the output is complete, never how fast anything was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from mlxlaunch.bench.summary import WORKLOADS

REPORT_FIELDS = {
    "schema", "date", "elapsed_s", "config", "machine", "model", "targets", "ours", "peer",
    "workloads", "summary", "warnings",
}  # fmt: skip
MACHINE_FIELDS = {"blas", "mlx", "mlx_lm", "device", "backend", "cpu_count", "memory_bytes"}
WORKLOAD_FIELDS = {"agent_session", "new_session", "concurrency", "decode", "prefill_floor"}
TIMING_FIELDS = {"ttft_s", "total_s", "prompt_tokens", "cached_tokens", "output_tokens"}


def test_quick_bench_prints_the_table_and_writes_a_complete_report(tmp_path: Path, tiny_model_dir):
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
    assert (
        len(report["workloads"]["prefill_floor"]) == 1 + config["turns"] + config["warm_sessions"]
    )
    assert {row["workload"].split(" ")[0] for row in report["summary"]} >= {
        "agent-session", "new-session", "concurrency", "decode", "prefill",
    }  # fmt: skip

    [chart] = out.glob("*.svg")
    assert ET.fromstring(chart.read_text()).tag.endswith("svg")
