"""Which rank counts a cluster benchmark measures, and how each one's server is started.

`mlx bench --hosts a,b,c` measures the same `mlx serve` once per rank count: 1 rank is the
plain one-process serve, k ranks is `mlx serve --hosts` on the first k hosts. Each runs as a
child process started the way a user starts it, so the only difference between two columns
of the report is how many ranks split the model.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.bench.restart import ServeProcess
from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.errors import ConfigError


def rank_name(count: int) -> str:
    """The column and JSON key of a rank count: "1 rank", "2 ranks"."""
    return "1 rank" if count == 1 else f"{count} ranks"


def parse_ranks(text: str | None, cluster: Cluster) -> tuple[int, ...]:
    """The rank counts `--ranks` names (default: 1 and every host), ascending, once each.

    Raises:
        ConfigError: not numbers, a count outside 1…hosts, or (with a hostfile) a count other
            than 1 and the hostfile's size (`mlx.launch` runs a hostfile whole).
    """
    if text is None:
        return (1, cluster.size)
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"--ranks takes rank counts like 1,2, not {text!r}") from None
    if not counts:
        raise ConfigError("--ranks names no rank count")
    wrong = [count for count in counts if not 1 <= count <= cluster.size]
    if wrong:
        raise ConfigError(
            f"--ranks {wrong[0]}: between 1 and the {cluster.size} hosts named",
            hint="k ranks run on the first k hosts of --hosts",
        )
    if cluster.hostfile is not None and any(1 < count < cluster.size for count in counts):
        raise ConfigError(
            f"--ranks with --hostfile: 1 or {cluster.size} (the whole hostfile)",
            hint="name the hosts with --hosts to measure fewer ranks than the hostfile has",
        )
    return tuple(counts)


def sub_cluster(cluster: Cluster, count: int) -> Cluster:
    """The cluster of `count` ranks: the first `count` hosts."""
    return dataclasses.replace(cluster, hosts=cluster.hosts[:count])


def cluster_args(cluster: Cluster, parallel: str) -> tuple[str, ...]:
    """The `mlx serve` flags that run it on `cluster`, split the way `parallel` says."""
    where = (
        ("--hostfile", str(cluster.hostfile))
        if cluster.hostfile is not None
        else ("--hosts", ",".join(cluster.hosts))
    )
    return (*where, "--backend", cluster.backend, "--parallel", parallel)


def overhead_note(cluster: Cluster, count: int, cpu_count: int | None = None) -> str | None:
    """What a k-rank figure means when every rank runs on this machine (None when they do
    not): the ranks share its cores, so the figure is the price of splitting the model."""
    if count < 2 or not cluster.local_only:
        return None
    cores = cpu_count or os.cpu_count() or 1
    return (
        f"{rank_name(count)}: every host is this machine, so the {count} ranks share its "
        f"{cores} CPU cores and the figures measure the lockstep and collective overhead of "
        "splitting the model, not a speed-up; run the ranks on separate machines to see what "
        "they buy"
    )


@dataclass(frozen=True)
class RankRun:
    """One rank count of the benchmark: its name, its cluster (None: one process), the split
    and the extra `mlx serve` flags."""

    count: int
    cluster: Cluster | None
    parallel: str | None
    serve_args: tuple[str, ...]

    @property
    def name(self) -> str:
        return rank_name(self.count)

    def server(self, model_dir: str, *, cache_dir: Path, auth_token: str) -> ServeProcess:
        """A new child process serving `model_dir` with this many ranks."""
        if self.cluster is None:
            return ServeProcess(
                model_dir, cache_dir=cache_dir, auth_token=auth_token, extra_args=self.serve_args
            )
        return ClusterServeProcess(
            model_dir, cache_dir=cache_dir, auth_token=auth_token, extra_args=self.serve_args
        )

    def describe(self) -> dict[str, object]:
        """For the JSON report."""
        return {
            "ranks": self.count,
            "hosts": list(self.cluster.hosts) if self.cluster else ["127.0.0.1"],
            "backend": self.cluster.backend if self.cluster else None,
            "parallel": self.parallel,
            "local_only": self.cluster.local_only if self.cluster else True,
        }


class ClusterServeProcess(ServeProcess):
    """`mlx serve --hosts …` as a child process. SIGTERM stops every rank (a Ctrl-C's
    equivalent for a process without a terminal); its own process group lets a kill after
    the timeout reach the ranks too."""

    log_prefix = "mlx-bench-cluster-"
    stop_signal = signal.SIGTERM
    own_process_group = True


def rank_runs(
    cluster: Cluster, counts: Sequence[int], parallels: dict[int, str], serve_args: tuple[str, ...]
) -> list[RankRun]:
    """A RankRun per count; `parallels` gives each cluster count its checked split."""
    runs = []
    for count in counts:
        if count == 1:
            runs.append(RankRun(1, None, None, serve_args))
            continue
        ranks = sub_cluster(cluster, count)
        split = parallels[count]
        runs.append(RankRun(count, ranks, split, (*serve_args, *cluster_args(ranks, split))))
    return runs
