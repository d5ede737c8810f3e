"""Issue 22: the pieces of a cluster serve that need no second process.

How the ranks settle a job's cached prefix (`prompt_caches.settle`), the rank spec that
carries a serve to every host (and keeps the token off command lines), the words a rank's end
is reported in, and the naming of the cluster on the command line (`cluster/hosts.py`). The
lockstep itself runs across real processes in test_distributed_sharding.py and
test_cluster_serve.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from mlxlaunch.cluster.hosts import Cluster, cluster_from_options, launch_argv, parse_hosts
from mlxlaunch.engine.scheduling.prompt_caches import settle
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.cluster_rank import SPEC_VARIABLE, TOKEN_VARIABLE, RankSpec
from mlxlaunch.launch.cluster_serve import RankProcesses
from mlxlaunch.launch.options import EngineOptions


def cache_of(tokens: int) -> list[KVCache]:
    cache = KVCache()
    cache.update_and_fetch(mx.zeros((1, 2, tokens, 4)), mx.zeros((1, 2, tokens, 4)))
    return [cache]


class Ranks:
    """The other ranks of an agreement: each round, the smallest of their answers."""

    def __init__(self, *rounds: int) -> None:
        self.rounds = list(rounds)
        self.asked: list[int] = []

    def __call__(self, mine: int) -> int:
        self.asked.append(mine)
        return min(mine, self.rounds.pop(0))


def test_ranks_that_hold_the_same_prefix_keep_it_whole() -> None:
    caches = cache_of(40)
    assert settle(40, caches, Ranks(40, 40)) == (40, caches)
    assert caches[0].offset == 40


def test_a_rank_that_holds_less_cuts_every_rank_back_to_it() -> None:
    caches = cache_of(40)
    held, kept = settle(40, caches, Ranks(25, 25))
    assert (held, kept) == (25, caches) and caches[0].offset == 25


def test_a_cache_that_cannot_be_cut_starts_fresh_and_says_so() -> None:
    class Untrimmable(KVCache):
        def is_trimmable(self) -> bool:
            return False

    cache = Untrimmable()
    cache.update_and_fetch(mx.zeros((1, 2, 40, 4)), mx.zeros((1, 2, 40, 4)))
    ranks = Ranks(25, 99)
    assert settle(40, [cache], ranks) == (0, None)
    assert ranks.asked == [40, 0]  # the second round tells the others this rank starts fresh


def test_a_rank_without_the_prefix_makes_every_rank_start_fresh() -> None:
    ranks = Ranks(40, 40)
    assert settle(0, None, ranks) == (0, None)
    assert settle(40, cache_of(40), Ranks(0, 0)) == (0, None)


def test_the_rank_spec_reaches_every_host_without_the_token() -> None:
    spec = RankSpec(
        model="tiny-moe",
        parallel="tensor",
        engine=EngineOptions(cache_dir=Path("/tmp/x"), render="exact"),
        auth_token="secret-token",
        allowed_origins=("http://localhost:3000",),
    )
    assert RankSpec.decoded(spec.encoded()) == spec
    ranks = RankProcesses(Cluster(("127.0.0.1", "127.0.0.1")), spec, relay=lambda line: None)
    argv, env = ranks.command()
    ranks.stop()
    specs = [a.partition("=")[2] for a in argv if a.startswith(f"{SPEC_VARIABLE}=")]
    assert len(specs) == 1
    public = RankSpec.decoded(specs[0])
    assert public.auth_token is None and public.model == "tiny-moe"
    assert public.auth_required  # rank 0 knows a token must come, and refuses without it
    assert not any("secret-token" in a for a in argv)
    assert env[TOKEN_VARIABLE] == "secret-token"  # rank 0's environment alone


@pytest.mark.parametrize(
    ("line", "stopping", "said"),
    [
        (
            "[WARN] Node with rank 1 exited with code 3",
            False,
            "rank 1 (on 10.0.0.2) exited with code 3",
        ),
        ("[WARN] Node with rank 1 was killed", False, "rank 1 (on 10.0.0.2) was killed"),
        (f"[WARN] Node with rank 0 exited with code -{int(signal.SIGTERM)}", True, None),
        ("[WARN] Node with rank 1 exited with code 0", False, None),
    ],
)
def test_a_ranks_end_is_reported_with_its_host(line: str, stopping: bool, said: str | None) -> None:
    relayed: list[str] = []
    spec = RankSpec(model="m", parallel="tensor")
    ranks = RankProcesses(Cluster(("127.0.0.1", "10.0.0.2")), spec, relayed.append)
    ranks.stopping = stopping

    class Lines:
        def __iter__(self) -> Any:
            return iter([line + "\n"])

    ranks._read(Lines())  # type: ignore[arg-type]
    assert ranks.failure == said
    assert relayed == [line]  # the user sees mlx.launch's own words too


def test_hosts_are_named_in_rank_order_and_checked() -> None:
    assert parse_hosts("127.0.0.1, 10.0.0.2") == ("127.0.0.1", "10.0.0.2")
    for bad, says in [
        ("127.0.0.1", "names one host"),
        ("127.0.0.1,,10.0.0.2", "empty"),
    ]:
        with pytest.raises(ConfigError, match=says):
            parse_hosts(bad)
    with pytest.raises(ConfigError, match="IP addresses"):
        cluster_from_options("127.0.0.1,mac-studio.local", None)
    with pytest.raises(ConfigError, match="not both"):
        cluster_from_options("127.0.0.1,10.0.0.2", Path("hosts.json"))
    with pytest.raises(ConfigError, match="need --hosts"):
        cluster_from_options(None, None, parallel="pipeline")
    assert cluster_from_options(None, None) is None
    local = cluster_from_options("localhost,127.0.0.1", None, parallel="pipeline")
    assert local == Cluster(("127.0.0.1", "127.0.0.1"), parallel="pipeline")


def test_a_hostfile_names_the_hosts_and_may_name_the_backend(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps({"backend": "jaccl", "hosts": [{"ssh": "m1", "ips": []}, {"ssh": "m2"}]})
    )
    cluster = cluster_from_options(None, hostfile)
    assert cluster is not None and cluster.hosts == ("m1", "m2") and cluster.backend == "jaccl"
    assert launch_argv(cluster, ["-m", "x"])[1:5] == [
        "--backend",
        "jaccl",
        "--hostfile",
        str(hostfile),
    ]
    hostfile.write_text("[not json")
    with pytest.raises(ConfigError, match="not JSON"):
        cluster_from_options(None, hostfile)


def test_a_ring_across_machines_listens_where_the_others_can_reach_it(tmp_path: Path) -> None:
    # `mlx.launch --hosts 127.0.0.1,…` would make rank 0 listen on loopback; a hostfile keeps
    # it a local process but on this machine's address towards the others.
    cluster = cluster_from_options("127.0.0.1,192.0.2.7", None)
    assert cluster is not None
    argv = launch_argv(cluster, ["-m", "x"], starting_port=40000, scratch=tmp_path)
    written = Path(argv[argv.index("--hostfile") + 1])
    assert written.parent == tmp_path  # the caller's scratch directory, removed with it
    hosts = json.loads(written.read_text())["hosts"]
    assert hosts[0]["ssh"] == "127.0.0.1" and hosts[0]["ips"] != ["127.0.0.1"]
    assert hosts[1] == {"ssh": "192.0.2.7", "ips": ["192.0.2.7"]}
    local = cluster_from_options("127.0.0.1,127.0.0.1", None)
    assert local is not None and "--hosts" in launch_argv(local, ["-m", "x"])
