"""Checks before a cluster starts: shard plans by mlx-lm's rules, and hosts that differ.

"Remote" hosts are this machine behind a fake `ssh` on PATH that drops ssh's options and runs
the remote command with bash, after sourcing a per-host environment file: so the real probe
runs, and a host differs only in what its environment makes it see (an older mlx-lm on its
PYTHONPATH, an empty model cache, a copy of the model with another config.json).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import mlx_lm.utils  # noqa: F401  (sets TRANSFORMERS_NO_ADVISORY_WARNINGS once, on import)
import pytest

from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.cluster.preflight import (
    HostFacts,
    ModelOnHost,
    Preflight,
    backend_problems,
    check_cluster,
    memory_problems,
    model_problems,
    probe_command,
    version_problems,
)
from mlxlaunch.cluster.shard_plan import INDEX_FILE, ShardPlan, shard_plan
from mlxlaunch.engine.engine import probe_shards
from mlxlaunch.errors import ConfigError
from mlxlaunch.testing import ensure_test_model

FAKE_SSH = """#!/bin/bash
# ssh [options] host command: drop the options, then run the command as that host would.
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
host="$1"; shift
if [ -f "$FAKE_SSH_DIR/$host.down" ]; then
  echo "ssh: connect to host $host port 22: No route to host" >&2
  exit 255
fi
[ -f "$FAKE_SSH_DIR/$host.env" ] && . "$FAKE_SSH_DIR/$host.env"
exec bash -c "$*"
"""

VERSIONS = {"python": "3.11.7", "mlx": "0.32.4", "mlx-lm": "0.32.2", "mlxlaunch": "0.1.0"}


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `ssh` first on PATH; returns the directory of its per-host files."""
    bindir, hosts = tmp_path / "bin", tmp_path / "hosts"
    bindir.mkdir()
    hosts.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH, encoding="utf-8")
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_DIR", str(hosts))
    return hosts


def _old_mlx_lm(directory: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes importlib.metadata see mlx-lm 0.0.1."""
    dist = directory / "mlx_lm-0.0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx-lm\nVersion: 0.0.1\n")
    return directory


def _host(name: str, **changes: object) -> HostFacts:
    facts: dict[str, object] = {
        "host": name,
        "reachable": True,
        "versions": dict(VERSIONS),
        "total_memory": 64 * 10**9,
        "available_memory": 48 * 10**9,
        "backends": {"ring": True, "jaccl": False, "mpi": False},
        "model": ModelOnHost(True, "/m", 10**9, "abc"),
    }
    facts.update(changes)
    return HostFacts(**facts)  # type: ignore[arg-type]


# --- shard plans: pure reads of the model directory (they build the test models) --------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "ranks", "asked", "parallel"),
    [
        ("tiny-moe", 2, "auto", "tensor"),
        ("tiny-moe", 2, "pipeline", "pipeline"),
        ("tiny-moe", 3, "auto", "pipeline"),  # 4 heads do not divide by 3
        ("medium", 2, "auto", "tensor"),
    ],
)
def test_shard_plan_picks_what_mlx_lm_can_do(
    name: str, ranks: int, asked: str, parallel: str
) -> None:
    plan = shard_plan(ensure_test_model(name), ranks, asked, probe_shards=probe_shards)  # type: ignore[arg-type]
    assert plan.parallel == parallel and plan.refusal is None
    assert len(plan.rank_bytes) == ranks
    assert all(0 < b <= plan.weight_bytes for b in plan.rank_bytes)
    if parallel == "tensor":
        assert plan.layers == () and len(set(plan.rank_bytes)) == 1
        assert plan.rank_bytes[0] < plan.weight_bytes
    else:
        # mlx-lm's split: rank 0 runs the last layers, the low ranks get the extra ones.
        expected = {2: ((2, 4), (0, 2)), 3: ((2, 4), (1, 2), (0, 1))}[ranks]
        assert plan.layers == expected
        assert sum(plan.rank_bytes) >= plan.weight_bytes  # embeddings are on every rank


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "ranks", "asked", "reason"),
    [
        ("tiny", 2, "tensor", "1 key/value heads do not divide by 2"),
        ("tiny", 2, "pipeline", "has no pipeline parallelism"),
        ("medium", 2, "pipeline", "has no pipeline parallelism"),
        ("tiny-moe", 3, "tensor", "4 attention heads do not divide by 3"),
        ("tiny-moe", 5, "pipeline", "4 layers cannot be split over 5 ranks"),
    ],
)
def test_shard_plan_refuses_with_the_reason(name: str, ranks: int, asked: str, reason: str) -> None:
    plan = shard_plan(ensure_test_model(name), ranks, asked, probe_shards=probe_shards)  # type: ignore[arg-type]
    assert plan.parallel is None
    assert plan.refusal is not None and reason in plan.refusal
    assert f"over {ranks} ranks with {asked} parallelism" in plan.refusal


@pytest.mark.slow
def test_auto_refuses_a_model_neither_mode_can_shard() -> None:
    plan = shard_plan(ensure_test_model("tiny"), 2, "auto", probe_shards=probe_shards)
    assert plan.parallel is None and plan.refusal is not None
    assert "1 key/value heads" in plan.refusal and "no pipeline" in plan.refusal


@pytest.mark.slow
def test_pipeline_needs_the_weight_index(tmp_path: Path) -> None:
    copy = Path(shutil.copytree(ensure_test_model("tiny-moe"), tmp_path / "moe"))
    (copy / INDEX_FILE).unlink()
    assert shard_plan(copy, 2, "auto", probe_shards=probe_shards).parallel == "tensor"
    plan = shard_plan(copy, 2, "pipeline", probe_shards=probe_shards)
    assert plan.refusal is not None and INDEX_FILE in plan.refusal


def test_a_directory_mlx_lm_cannot_build_is_refused_not_raised(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_arch"}))
    plan = shard_plan(tmp_path, 2, "auto", probe_shards=probe_shards)
    assert plan.parallel is None and plan.refusal and "cannot build" in plan.refusal


# --- judging hosts' facts: pure ------------------------------------------------------------


def test_version_mismatch_names_the_hosts_and_versions() -> None:
    odd = _host("10.0.0.2", versions=VERSIONS | {"mlx-lm": "0.31.0"})
    (problem,) = version_problems([_host("10.0.0.1"), odd])
    assert problem.kind == "versions" and problem.hosts == ("10.0.0.2",)
    assert "0.32.2 on 10.0.0.1; 0.31.0 on 10.0.0.2" in problem.text
    assert "pip install mlx-lm==0.32.2" in problem.text


def test_model_missing_and_differing_copies_are_problems() -> None:
    hosts = [
        _host("a"),
        _host("b", model=ModelOnHost(False, error="model 'm' is not downloaded")),
        _host("c", model=ModelOnHost(True, "/m", 10**9, "other")),
    ]
    missing, differ = model_problems(hosts, "m")
    assert missing.kind == "model-missing" and missing.hosts == ("b",)
    assert "mlx models pull m" in missing.text
    assert differ.kind == "model-differs" and differ.hosts == ("c",)


def test_a_shard_larger_than_a_hosts_memory_is_a_problem() -> None:
    cluster = Cluster(("a", "a", "b"))
    plan = ShardPlan(3, "auto", "pipeline", "qwen3_moe", 90, (30, 30, 30))
    hosts = [_host("a", available_memory=50), _host("b", available_memory=50)]
    (problem,) = memory_problems(cluster, hosts, plan)
    assert problem.hosts == ("a",) and "ranks 0, 1 need 60 B" in problem.text


def test_a_missing_backend_and_refuse_lists_every_problem() -> None:
    hosts = [_host("a"), _host("b", backends={"ring": True, "jaccl": False})]
    (backend,) = backend_problems(hosts, "jaccl")
    assert backend.hosts == ("a", "b") and "macOS 26.2" in backend.text
    preflight = Preflight(Cluster(("a", "b")), None, tuple(hosts), None, (backend, backend))
    with pytest.raises(ConfigError, match="2 problems") as caught:
        preflight.refuse()
    assert caught.value.message.count("JACCL") == 2
    Preflight(Cluster(("a", "b")), None, tuple(hosts), None, ()).refuse()  # nothing: no raise


def test_remote_hosts_are_probed_through_ssh_without_a_password_prompt() -> None:
    local = probe_command("127.0.0.1", "my model", python="/opt/py")
    assert local == ["/opt/py", "-m", "mlxlaunch.cluster.probe", "--model=my model"]
    remote = probe_command("10.0.0.2", "my model", python="/opt/py")
    assert remote[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    assert remote[5:7] == ["--", "10.0.0.2"]  # the destination is never read as an option
    assert remote[7] == "/opt/py -m mlxlaunch.cluster.probe '--model=my model'"


# --- the real probe on every host, through the fake ssh -----------------------------------


@pytest.mark.slow
def test_alike_hosts_pass_and_the_plan_is_resolved(fake_ssh: Path) -> None:
    ensure_test_model("tiny-moe")
    preflight = check_cluster(
        Cluster(("127.0.0.1", "10.0.0.2")), "tiny-moe", probe_shards=probe_shards
    )
    assert preflight.problems == ()
    assert preflight.parallel == "tensor"
    local, remote = preflight.hosts
    assert remote.reachable and remote.versions == local.versions
    assert remote.model is not None and remote.model.found
    assert remote.model.fingerprint == local.model.fingerprint  # type: ignore[union-attr]
    preflight.refuse()


@pytest.mark.slow
def test_hosts_that_differ_are_refused_with_each_reason(fake_ssh: Path, tmp_path: Path) -> None:
    model = ensure_test_model("tiny-moe")
    # 10.0.0.2 sees an older mlx-lm; 10.0.0.3 has no model; 10.0.0.4 another config.json.
    old = _old_mlx_lm(tmp_path / "old")
    (fake_ssh / "10.0.0.2.env").write_text(f"export PYTHONPATH={old}\n")
    (fake_ssh / "10.0.0.3.env").write_text(f"export MLXLAUNCH_HOME={tmp_path / 'empty'}\n")
    other_home = tmp_path / "other"
    copy = other_home / "test-models" / model.name
    shutil.copytree(model, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"rope_theta": 10000.0}))
    (fake_ssh / "10.0.0.4.env").write_text(f"export MLXLAUNCH_HOME={other_home}\n")
    (fake_ssh / "10.0.0.9.down").touch()

    hosts = ("127.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.9")
    preflight = check_cluster(Cluster(hosts), "tiny-moe", probe_shards=probe_shards)

    kinds = {p.kind: p for p in preflight.findings}
    assert set(kinds) == {
        "unreachable",
        "versions",
        "model-missing",
        "model-differs",
        "unshardable",
    }
    assert kinds["unreachable"].hosts == ("10.0.0.9",)
    assert "No route to host" in kinds["unreachable"].text
    assert kinds["versions"].hosts == ("10.0.0.2",)
    assert "mlx-lm differs across hosts" in kinds["versions"].text
    assert "0.0.1 on 10.0.0.2" in kinds["versions"].text
    assert kinds["model-missing"].hosts == ("10.0.0.3",)
    assert "not built on this host" in kinds["model-missing"].text
    assert "mlx serve --model tiny-moe" in kinds["model-missing"].text  # built, not pulled
    assert kinds["model-differs"].hosts == ("10.0.0.4",)
    assert "over 5 ranks" in kinds["unshardable"].text  # 4 heads, 4 layers
    with pytest.raises(ConfigError, match="5 problems"):
        preflight.refuse()
