"""`mlx serve --hosts …` and `mlx launch <agent> --hosts …`: the checks and the spec of a
cluster serve, between the commands' options and launch/cluster_serve.py.

Everything that can be refused is refused before any rank starts: rank 0 not on this machine,
a host that cannot be reached, different versions or model files across hosts, a model that
cannot be split that way (cluster/preflight.py).
"""

from __future__ import annotations

from mlxlaunch.cluster.hosts import Cluster, is_local
from mlxlaunch.errors import ConfigError


def checked_parallel(cluster: Cluster, model: str) -> str:
    """The split every rank will use, once the cluster passed every up-front check.

    Raises:
        ConfigError: rank 0 is not this machine, or a check failed (all reasons listed).
    """
    from mlxlaunch.cluster.preflight import check_cluster
    from mlxlaunch.engine.engine import probe_shards  # mlx-lm's answer: MLX loads only here

    if not is_local(cluster.hosts[0]):
        # mlx.launch would start it over ssh, where rank 0's token never arrives.
        raise ConfigError(
            f"the first host ({cluster.hosts[0]}) must be this machine, written 127.0.0.1: "
            "rank 0 serves HTTP where the command runs, and mlx.launch starts every other "
            "name (this machine's hostname or address too) over ssh",
            hint='list 127.0.0.1 first (in a hostfile: "ssh": "127.0.0.1"), then the other '
            "machines",
        )
    preflight = check_cluster(cluster, model, cluster.parallel, probe_shards=probe_shards)
    preflight.refuse()
    if preflight.parallel is None:
        raise ConfigError(f"cannot tell how to split {model} across {cluster.size} ranks")
    return preflight.parallel


def describe(cluster: Cluster, parallel: str) -> str:
    """The cluster in one line, e.g. `2 ranks, tensor parallel, over ring: a, b`."""
    hosts = ", ".join(cluster.hosts)
    return f"{cluster.size} ranks, {parallel} parallel, over {cluster.backend}: {hosts}"
