"""Issue 22: `mlx bench --hosts 127.0.0.1,127.0.0.1` — one process and two ranks, side by side.

The smallest workloads on the tiny MoE test model: the report has both rank counts with their
tokens/s and time to first token and the ratio of one to the other, says that two ranks on
one machine measure overhead, not a speed-up, and leaves no rank process behind. Checks that
the output is complete, never how fast anything was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlx.core as mx
import pytest

from mlxlaunch.bench.cluster_bench import merge_figures
from mlxlaunch.bench.ranks import overhead_note, parse_ranks, rank_runs
from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.errors import ConfigError

MLX = [sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()"]
RANK_MARK = "mlxlaunch.launch.cluster_rank"
# Set in the bench's environment, inherited by every process it starts: finds this test's
# ranks among those of other tests running at the same time.
RUN_VARIABLE = "MLX_BENCH_CLUSTER_TEST_RUN"
# The smallest run that still has every row kind: two agent turns (so prefix reuse is
# measured), one decode run, one concurrency level.
SMALLEST = [
    "--quick", "--turns", "2", "--runs", "1", "--decode-tokens", "8", "--concurrency", "1",
    "--concurrency-tokens", "4", "--concurrency-prompt-tokens", "64",
    "--no-restart", "--no-tool-loop", "--no-codex-session",
]  # fmt: skip


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0"))
    return {name: value for name, _, value in pairs if name}


def rank_pids(run: str) -> list[int]:
    """Live rank processes started by the bench run marked `run`."""
    listing = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listing.splitlines():
        pid, stat, args = [*line.split(None, 2), "", ""][:3]
        live = RANK_MARK in args and not stat.startswith("Z")
        if live and _environment(int(pid)).get(RUN_VARIABLE) == run:
            found.append(int(pid))
    return found


def test_ranks_default_to_one_and_every_host_and_are_checked() -> None:
    cluster = Cluster(("127.0.0.1",) * 3)
    assert parse_ranks(None, cluster) == (1, 3)
    assert parse_ranks("3,1,2,2", cluster) == (1, 2, 3)
    for wrong in ("4", "0", "two", ""):
        with pytest.raises(ConfigError):
            parse_ranks(wrong, cluster)
    with pytest.raises(ConfigError, match="hostfile"):
        parse_ranks("2", Cluster(("127.0.0.1",) * 3, hostfile=Path("hosts.json")))


def test_each_rank_count_serves_on_the_first_hosts_and_local_ranks_are_called_overhead() -> None:
    cluster = Cluster(("127.0.0.1", "127.0.0.1", "10.0.0.2"), parallel="auto")
    one, two, three = rank_runs(cluster, (1, 2, 3), {2: "tensor", 3: "pipeline"}, ())
    assert (one.cluster, one.serve_args) == (None, ())
    assert two.serve_args == (
        "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--parallel", "tensor",
    )  # fmt: skip
    assert three.serve_args[1] == "127.0.0.1,127.0.0.1,10.0.0.2"
    assert [r.name for r in (one, two, three)] == ["1 rank", "2 ranks", "3 ranks"]
    assert two.cluster is not None and three.cluster is not None
    note = overhead_note(two.cluster, 2, cpu_count=2)
    assert note is not None and "overhead" in note and "not a speed-up" in note
    assert overhead_note(three.cluster, 3) is None  # a real second machine: a real figure


def test_figures_of_runs_on_their_own_servers_merge_as_if_measured_together() -> None:
    one = {"targets": ["1 rank"], "warmup": {"1 rank": {"ttft_s": 1.0}},
           "agent_session": [{"turn": 1, "results": {"1 rank": {"ttft_s": 0.5}}}]}  # fmt: skip
    two = {"targets": ["2 ranks"], "warmup": {"2 ranks": {"ttft_s": 2.0}},
           "agent_session": [{"turn": 1, "results": {"2 ranks": {"ttft_s": 0.7}}}]}  # fmt: skip
    merged = merge_figures([one, two])
    assert merged["targets"] == ["1 rank", "2 ranks"]
    assert merged["warmup"] == {"1 rank": {"ttft_s": 1.0}, "2 ranks": {"ttft_s": 2.0}}
    assert merged["agent_session"] == [
        {"turn": 1, "results": {"1 rank": {"ttft_s": 0.5}, "2 ranks": {"ttft_s": 0.7}}}
    ]


@pytest.mark.slow
@pytest.mark.xdist_group("cluster")  # ranks of 2-3 processes each: one such test at a time
@pytest.mark.skipif(
    not mx.distributed.is_available("ring"), reason="MLX's ring backend is not available"
)
def test_bench_on_two_local_ranks_reports_both_rank_counts_and_leaves_no_rank(
    tmp_path: Path,
) -> None:
    from mlxlaunch.testing import ensure_test_model

    ensure_test_model("tiny-moe")
    run = uuid.uuid4().hex
    out = tmp_path / "results"
    command = [*MLX, "bench", "--model", "tiny-moe", "--hosts", "127.0.0.1,127.0.0.1",
               *SMALLEST, "--out", str(out)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", RUN_VARIABLE: run}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, output
    deadline = time.monotonic() + 10
    while rank_pids(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rank_pids(run) == [], "a rank outlived the bench"

    assert "1 rank" in output and "2 ranks" in output and "2 ranks / 1 rank" in output
    flat = " ".join(output.split())  # the note wraps at the terminal's width
    assert "share its" in flat and "overhead" in flat and "not a speed-up" in flat

    [json_path] = out.glob("*.json")
    report = json.loads(json_path.read_text())
    assert report["ranks"]["names"] == ["1 rank", "2 ranks"]
    assert report["ranks"]["local_only"] and "overhead" in report["ranks"]["notes"][0]
    assert report["targets"]["2 ranks"]["parallel"] == "tensor"
    assert "--hosts" in report["targets"]["2 ranks"]["command"]
    assert "--hosts" not in report["targets"]["1 rank"]["command"]
    summary = {(row["workload"], row["metric"]): row for row in report["summary"]}
    for key in [
        ("decode", "tokens/s end to end p50"),
        ("new-session", "cold TTFT"),
        ("agent-session", "turn 2 TTFT"),
        ("concurrency 1", "aggregate tokens/s"),
        ("concurrency 1", "TTFT p50"),
    ]:
        row = summary[key]
        assert all(row["values"][name] > 0 for name in ("1 rank", "2 ranks")), key
        assert row["ratios"]["2 ranks"] > 0, key
    # Every rank holds its shard of the session's prefix: the next turn reuses it on both.
    reuse = summary[("agent-session", "reuse of previous prompt, min")]["values"]
    assert reuse["1 rank"] > 0.9 and reuse["2 ranks"] > 0.9

    [table] = out.glob("*.md")
    text = table.read_text()
    assert "| workload | metric | 1 rank | 2 ranks | 2 ranks / 1 rank | limit |" in text
    assert "Note: 2 ranks: every host is this machine" in text
