"""The link between a cluster's ranks, measured: all_sum latency and bandwidth.

`measure_link(cluster)` starts one tiny rank per host through `mlx.launch` (the same path a
serve takes, so it measures the backend and network a serve would use); each rank times
`all_sum` of one float (latency: what every decode step pays per collective) and of a 16 MiB
array (bandwidth: what prefill and pipeline hand-offs pay), and rank 0 prints the figures.

Design: the launcher runs in its own process group, killed in a `finally`, with a timeout, so
a rank that hangs on an unreachable peer leaves nothing behind. Bandwidth is given two ways:
`algorithm` (payload / time) and `bus` (what the ring moves per rank, 2(n-1)/n of the payload,
the figure comparable to a link's rated speed, as NCCL's tests report it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.cluster.hosts import Cluster, launch_argv

MARKER = "MLXLAUNCH_LINK "  # rank 0's result line, found among whatever else ranks print
LINK_TIMEOUT = 60.0
LATENCY_ROUNDS = 50
BANDWIDTH_ROUNDS = 5
PAYLOAD_BYTES = 16 * 1024 * 1024
WARMUP_ROUNDS = 3


@dataclass(frozen=True)
class LinkFigures:
    """What the ranks measured, or why nothing was (`error`)."""

    ranks: int
    latency_us: float | None = None  # median all_sum of one float
    algorithm_gb_s: float | None = None  # payload bytes / median time, GB/s (10^9)
    bus_gb_s: float | None = None  # bytes each rank moves over the ring / median time
    payload_bytes: int = PAYLOAD_BYTES
    error: str | None = None

    def describe(self) -> str:
        """One line for a report."""
        if self.error is not None:
            return f"not measured: {self.error}"
        return (
            f"latency {self.latency_us:.0f} µs (all_sum of 1 float, median); bandwidth "
            f"{self.bus_gb_s:.2f} GB/s bus, {self.algorithm_gb_s:.2f} GB/s algorithm "
            f"({self.payload_bytes // (1024 * 1024)} MiB all_sum, {self.ranks} ranks)"
        )


def measure_link(
    cluster: Cluster,
    *,
    python: str | None = None,
    timeout: float = LINK_TIMEOUT,
    payload_bytes: int = PAYLOAD_BYTES,
) -> LinkFigures:
    """Start the ranks of `cluster` through `mlx.launch` and time their collectives; never
    raises for a failed run (the error is in the figures)."""
    command = ["-m", __name__, "--backend", cluster.backend, "--bytes", str(payload_bytes)]
    # mlx.launch writes a hostfile per rank into TMPDIR and leaves it: keep them in our own,
    # with the ring's hostfile when one is made here.
    with tempfile.TemporaryDirectory(prefix="mlxlaunch-link-") as scratch:
        try:
            argv = launch_argv(cluster, command, python=python, scratch=Path(scratch))
        except Exception as exc:  # no mlx.launch, no free ports
            return LinkFigures(cluster.size, error=getattr(exc, "message", str(exc)))
        launcher = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,  # not /dev/null: mlx.launch's stdin relay would spin on it
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | {"TMPDIR": scratch},
            start_new_session=True,  # its own process group: the local ranks join it
        )
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return LinkFigures(cluster.size, error=f"the ranks did not finish in {timeout:.0f} s")
        finally:
            stop_group(launcher)
    return read_figures(cluster.size, stdout, stderr)


def read_figures(ranks: int, stdout: str, stderr: str) -> LinkFigures:
    """The figures in rank 0's marked line, else the launch's last error line."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            return LinkFigures(
                ranks,
                latency_us=data["latency_us"],
                algorithm_gb_s=data["algorithm_gb_s"],
                bus_gb_s=data["bus_gb_s"],
                payload_bytes=data["payload_bytes"],
            )
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "[WARN]" in line]
    return LinkFigures(ranks, error=(errors or lines or ["no figures from rank 0"])[-1].strip())


def stop_group(launcher: subprocess.Popen[str]) -> None:
    """Stop mlx.launch and every rank in its process group (a no-op after a clean exit)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(launcher.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _group_alive(launcher.pid):
            time.sleep(0.05)
        if not _group_alive(launcher.pid):
            break
    if launcher.poll() is None:
        launcher.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# --- on each rank -----------------------------------------------------------------------


def _median_seconds(run: Callable[[], None], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rank_main(backend: str, payload_bytes: int) -> dict[str, float | int]:
    """Time the collectives on this rank (all ranks run it in step); the figures."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend=backend)
    one = mx.array([1.0])
    payload = mx.ones((payload_bytes // 4,), dtype=mx.float32)
    mx.eval(one, payload)

    def small() -> None:
        mx.eval(mx.distributed.all_sum(one, group=group, stream=mx.cpu))

    def large() -> None:
        mx.eval(mx.distributed.all_sum(payload, group=group, stream=mx.cpu))

    for _ in range(WARMUP_ROUNDS):
        small()
    large()
    latency = _median_seconds(small, LATENCY_ROUNDS)
    seconds = _median_seconds(large, BANDWIDTH_ROUNDS)
    ranks = group.size()
    moved = payload_bytes * 2 * (ranks - 1) / ranks
    return {
        "rank": group.rank(),
        "latency_us": latency * 1e6,
        "algorithm_gb_s": payload_bytes / seconds / 1e9,
        "bus_gb_s": moved / seconds / 1e9,
        "payload_bytes": payload_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlxlaunch.cluster.link")
    parser.add_argument("--backend", default="ring")
    parser.add_argument("--bytes", type=int, default=PAYLOAD_BYTES)
    args = parser.parse_args(argv)
    figures = rank_main(args.backend, args.bytes)
    if figures["rank"] == 0:
        sys.stdout.write(MARKER + json.dumps(figures) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip mlx's teardown: the figures are out, and peers may already be gone
