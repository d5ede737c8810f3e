"""`mlx serve --hosts …` and `mlx launch <agent> --hosts …`: the checks and the spec of a
cluster serve, between the commands' options and launch/cluster_serve.py.

Everything that can be refused is refused before any rank starts: rank 0 not on this machine,
a host that cannot be reached, different versions or model files across hosts, a model that
cannot be split that way (cluster/preflight.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlxlaunch.cluster.hosts import Cluster, is_local
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.serving import EngineOptions


def checked_parallel(cluster: Cluster, model: str) -> str:
    """The split every rank will use, once the cluster passed every up-front check.

    Raises:
        ConfigError: rank 0 is not this machine, or a check failed (all reasons listed).
    """
    from mlxlaunch.cluster.preflight import check_cluster

    if not is_local(cluster.hosts[0]):
        # mlx.launch would start it over ssh, where rank 0's token never arrives.
        raise ConfigError(
            f"the first host ({cluster.hosts[0]}) must be this machine, written 127.0.0.1: "
            "rank 0 serves HTTP where the command runs, and mlx.launch starts every other "
            "name (this machine's hostname or address too) over ssh",
            hint='list 127.0.0.1 first (in a hostfile: "ssh": "127.0.0.1"), then the other '
            "machines",
        )
    preflight = check_cluster(cluster, model, cluster.parallel)
    preflight.refuse()
    if preflight.parallel is None:
        raise ConfigError(f"cannot tell how to split {model} across {cluster.size} ranks")
    return preflight.parallel


def engine_fields(options: EngineOptions) -> dict[str, Any]:
    """EngineOptions as JSON-able fields (the rank spec carries them to every host).

    Raises:
        ConfigError: an option a cluster cannot honour.
    """
    if options.speculate in ("lookup", "draft"):
        raise ConfigError(
            f"--speculate {options.speculate} cannot be used with --hosts: the ranks decode in "
            "lockstep, one token per step",
            hint="leave --speculate at auto (off on a cluster) or use one machine",
        )
    return {
        name: str(value) if isinstance(value, Path) else value
        for name, value in dataclasses.asdict(options).items()
    }


def describe(cluster: Cluster, parallel: str) -> str:
    hosts = ", ".join(cluster.hosts)
    return f"{cluster.size} ranks, {parallel} parallel, over {cluster.backend}: {hosts}"
