"""Pipeline-rank pulls: the layer split against mlx-lm's own, and `mlx models pull --shard` /
`--hosts` fetching only each rank's files from the fake hub (remote hosts through a fake ssh)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakehub import FakeHub
from mlx_lm.models.bailing_hybrid import LanguageModel as BailingLanguageModel
from mlx_lm.models.kimi_k3 import KimiK3TextModel
from mlx_lm.models.pipeline import PipelineMixin

from mlxlaunch.cli.main import main
from mlxlaunch.cluster.architecture import Support, parallel_mode
from mlxlaunch.errors import ConfigError, ModelNotFound
from mlxlaunch.store import list_models, plan_pull, pull, snapshot_complete, verify_model_dir
from mlxlaunch.store.resolve import resolve_model
from mlxlaunch.store.shards import (
    MARKER_FILE,
    ShardMarker,
    ShardSpec,
    files_for_rank,
    layer_range,
    parse_shard,
    pipeline_split,
    rank_files,
    read_marker,
    write_marker,
)

SPLIT_REPO = "test-org/tiny-moe-split"
LAYERS = 4
# tiny-moe re-saved as one file of non-layer weights plus one file per layer.
HEAD_FILE = "model-00001-of-00005.safetensors"


def layer_file(layer: int) -> str:
    return f"model-{layer + 2:05d}-of-00005.safetensors"


class FakeGroup:
    """What `pipeline()` reads of an `mx.distributed.Group`."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def moe_config(layers: int = LAYERS) -> dict[str, Any]:
    return {"model_type": "qwen3_moe", "num_hidden_layers": layers}


# ---- the split -------------------------------------------------------------------------------


def test_parse_shard() -> None:
    assert parse_shard("1/2") == ShardSpec((1,), 2)
    assert parse_shard("2,0/3") == ShardSpec((0, 2), 3)
    assert parse_shard("0,1/2").whole and parse_shard("0,2/3").label == "0,2/3"
    for bad in ("1", "2/2", "a/2", "1/0", "/2", "-1/2"):
        with pytest.raises(ConfigError):
            parse_shard(bad)


def _mlx_lm_ranges(pipeline: Any, make: Any, layers: int, size: int) -> list[tuple[int, int]]:
    ranges = []
    for rank in range(size):
        model = make(layers)
        pipeline(model, FakeGroup(rank, size))
        ranges.append((model.start_idx, model.end_idx))
    return ranges


def _ours(config: dict[str, Any], size: int) -> list[tuple[int, int]]:
    return [layer_range(config, rank, size) for rank in range(size)]


def test_even_split_is_pipeline_mixins() -> None:
    for layers in range(1, 13):
        for size in range(1, min(layers, 5) + 1):
            want = _mlx_lm_ranges(
                PipelineMixin.pipeline,
                lambda n: SimpleNamespace(layers=list(range(n))),
                layers,
                size,
            )
            assert _ours(moe_config(layers), size) == want, (layers, size)
    assert _ours(moe_config(5), 2) == [(2, 5), (0, 2)]  # rank 0 holds the last layers


def test_kimi_k3_split_is_its_own() -> None:
    def make(n: int) -> SimpleNamespace:
        return SimpleNamespace(
            layers=list(range(n)), use_attn_res=False, _set_cache_indices=lambda: None
        )

    for layers in range(1, 13):
        for size in range(1, min(layers, 5) + 1):
            config = {"model_type": "kimi_k3", "text_config": {"num_hidden_layers": layers}}
            want = _mlx_lm_ranges(KimiK3TextModel.pipeline, make, layers, size)
            assert _ours(config, size) == want, (layers, size)
    # Unlike the even split, the first layers' rank gets the extra one.
    assert _ours({"model_type": "kimi_k3", "num_hidden_layers": 5}, 2) == [(3, 5), (0, 3)]


def test_bailing_hybrid_split_keeps_layer_groups() -> None:
    def make(group: int) -> Any:
        def build(n: int) -> Any:
            model = BailingLanguageModel.__new__(BailingLanguageModel)  # only what pipeline() reads
            for key, value in {
                "layers": list(range(n)),
                "layer_group_size": group,
                "pipeline_rank": 0,
                "pipeline_size": 1,
                "start_idx": 0,
                "end_idx": None,
                "_attn_idx": 0,
                "_set_mask_indices": lambda: None,
            }.items():
                object.__setattr__(model, key, value)
            return model

        return build

    for group in (1, 2, 3):
        for layers in range(group, 13):
            for size in range(1, layers // group + 1):
                config = {
                    "model_type": "bailing_hybrid",
                    "num_hidden_layers": layers,
                    "layer_group_size": group,
                }
                want = _mlx_lm_ranges(BailingLanguageModel.pipeline, make(group), layers, size)
                assert _ours(config, size) == want, (group, layers, size)


def test_more_ranks_than_layers_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be split"):
        pipeline_split(moe_config(2), 3)
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        pipeline_split({"model_type": "qwen3_moe"}, 2)


@pytest.mark.slow
def test_split_equals_mlx_lm_on_the_tiny_moe_model() -> None:
    """mlx-lm's own `model.model.pipeline` on the lazily loaded tiny MoE, as sharded_load."""
    from mlx_lm.utils import load_model

    from mlxlaunch.testing import ensure_test_model

    path = ensure_test_model("tiny-moe")
    config = json.loads((path / "config.json").read_text())
    for size in (1, 2, 3, 4):
        for rank in range(size):
            model, _ = load_model(path, lazy=True, strict=False)
            model.model.pipeline(FakeGroup(rank, size))
            want = (model.model.start_idx, model.model.end_idx)
            assert layer_range(config, rank, size) == want, (rank, size)


# ---- which files a rank needs ----------------------------------------------------------------


def split_weight_map(layers: int = LAYERS) -> dict[str, str]:
    weight_map = {"model.embed_tokens.weight": HEAD_FILE, "model.norm.weight": HEAD_FILE}
    for layer in range(layers):
        for name in ("self_attn.q_proj.weight", "mlp.switch_mlp.up_proj.weight"):
            weight_map[f"model.layers.{layer}.{name}"] = layer_file(layer)
    return weight_map


def test_rank_files_are_its_layers_and_the_non_layer_weights() -> None:
    weight_map = split_weight_map()
    assert rank_files(moe_config(), weight_map, 0, 2) == {HEAD_FILE, layer_file(2), layer_file(3)}
    assert rank_files(moe_config(), weight_map, 1, 2) == {HEAD_FILE, layer_file(0), layer_file(1)}
    assert rank_files(moe_config(), weight_map, 0, 1) == set(weight_map.values())
    # A layer split across files, and MTP layers past the last one (never loaded).
    weight_map["model.layers.1.mlp.gate.weight"] = layer_file(2)
    weight_map["model.layers.4.eh_proj.weight"] = "model-mtp.safetensors"
    assert rank_files(moe_config(), weight_map, 1, 2) == {
        HEAD_FILE,
        layer_file(0),
        layer_file(1),
        layer_file(2),
    }
    assert "model-mtp.safetensors" not in rank_files(moe_config(), weight_map, 0, 2)


def test_rank_files_refuse_a_checkpoint_without_some_layer() -> None:
    weight_map = {k: v for k, v in split_weight_map().items() if ".layers.2." not in k}
    with pytest.raises(ConfigError, match=r"no weights for layers \[2\]"):
        rank_files(moe_config(), weight_map, 0, 2)


def test_files_for_rank_keep_every_non_weight_file() -> None:
    repo = ["config.json", "tokenizer.json", "chat_template.jinja", "model.safetensors.index.json"]
    weights = [HEAD_FILE, *(layer_file(n) for n in range(LAYERS))]
    got = files_for_rank(moe_config(), split_weight_map(), repo + weights, 1, 2)
    assert got == {*repo, HEAD_FILE, layer_file(0), layer_file(1)}
    # No index: one way to have the weights, all of them.
    assert files_for_rank(moe_config(), {}, [*repo, "model.safetensors"], 1, 2) == {
        *repo,
        "model.safetensors",
    }


def test_parallel_mode_follows_mlx_lm_rule() -> None:
    both, pipeline_only, tensor_only = (
        Support(True, True),
        Support(False, True),
        Support(True, False),
    )
    assert parallel_mode({}, "auto", both) == "tensor"
    assert parallel_mode({}, "auto", pipeline_only) == "pipeline"
    assert parallel_mode({}, "pipeline", both) == "pipeline"
    assert parallel_mode({}, "tensor", pipeline_only) == "tensor"
    assert parallel_mode({}, "auto", Support(False, False)) == "tensor"  # every file, then
    with pytest.raises(ConfigError, match="no pipeline"):
        parallel_mode({"model_type": "qwen3"}, "pipeline", tensor_only)
    with pytest.raises(ConfigError):
        parallel_mode({}, "sideways", both)


@pytest.mark.slow
def test_architecture_support_is_read_from_mlx_lm() -> None:
    from mlxlaunch.testing import ensure_test_model

    moe = json.loads((ensure_test_model("tiny-moe") / "config.json").read_text())
    dense = json.loads((ensure_test_model("medium") / "config.json").read_text())
    assert parallel_mode(moe) == "tensor" and parallel_mode(moe, "pipeline") == "pipeline"
    with pytest.raises(ConfigError, match="no pipeline"):
        parallel_mode(dense, "pipeline")  # dense qwen3 has no pipeline() in mlx-lm
    assert parallel_mode({"model_type": "frobnicator"}) == "tensor"


def test_marker_round_trip_and_merge(tmp_path: Path) -> None:
    one = ShardMarker(ShardSpec((1,), 3), ("b", "a"))
    write_marker(tmp_path, one)
    assert read_marker(tmp_path) == one
    merged = one.merged(ShardMarker(ShardSpec((0,), 3), ("c", "a")))
    assert merged == ShardMarker(ShardSpec((0, 1), 3), ("a", "b", "c"))
    assert one.merged(ShardMarker(ShardSpec((0,), 2), ("c",))).spec == ShardSpec((0,), 2)
    write_marker(tmp_path, None)
    assert read_marker(tmp_path) is None and not (tmp_path / MARKER_FILE).exists()
    (tmp_path / MARKER_FILE).write_text("{not json")
    assert read_marker(tmp_path) is None


# ---- pulls from the fake hub -----------------------------------------------------------------


@pytest.fixture(scope="module")
def split_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-moe with its weights in 5 files (head, then one per layer) and their index."""
    import mlx.core as mx

    from mlxlaunch.store.shards import LAYER_KEY
    from mlxlaunch.testing import ensure_test_model

    source = ensure_test_model("tiny-moe")
    target = tmp_path_factory.mktemp("tiny-moe-split")
    weights = mx.load(str(source / "model.safetensors"))
    assert isinstance(weights, dict)
    by_file: dict[str, dict[str, mx.array]] = {}
    for key, value in weights.items():
        match = LAYER_KEY.search(key)
        file = layer_file(int(match.group(1))) if match else HEAD_FILE
        by_file.setdefault(file, {})[key] = value
    assert len(by_file) == LAYERS + 1
    for file, tensors in by_file.items():
        mx.save_safetensors(str(target / file), tensors, metadata={"format": "mlx"})
    index = {"metadata": {}, "weight_map": {k: f for f, ts in by_file.items() for k in ts}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


@pytest.fixture
def split_hub(hub: FakeHub, split_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setenv("COLUMNS", "200")
    hub.add_repo_from_dir(SPLIT_REPO, split_model_dir)
    return hub


def fetched(hub: FakeHub) -> set[str]:
    """The weight files the hub sent."""
    return {
        p.rsplit("/", 1)[1] for m, p, _ in hub.requests if m == "GET" and p.endswith(".safetensors")
    }


def snapshot_files(cache: Path) -> set[str]:
    [snapshot] = (cache / "models--test-org--tiny-moe-split" / "snapshots").iterdir()
    return {p.name for p in snapshot.iterdir()}


RANK1 = {HEAD_FILE, layer_file(0), layer_file(1)}
RANK0 = {HEAD_FILE, layer_file(2), layer_file(3)}
SMALL_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json"}


@pytest.mark.slow
def test_shard_pull_fetches_only_its_ranks_files(split_hub: FakeHub, hub_cache: Path) -> None:
    plan = plan_pull(SPLIT_REPO, shard=ShardSpec((1,), 2))
    assert {f.name for f in plan.files} == RANK1 | SMALL_FILES | {"model.safetensors.index.json"}
    assert set(plan.other_ranks) == {layer_file(2), layer_file(3)}
    result = pull(plan)
    assert fetched(split_hub) == RANK1
    on_disk = snapshot_files(hub_cache)
    assert on_disk >= RANK1 and not on_disk & {layer_file(2), layer_file(3)}
    assert result.report.ok, result.report.problems
    assert any("shard 1/2" in note for note in result.report.notes)
    [model] = list_models()
    assert model.shard == "1/2" and not model.complete and model.as_json()["shard"] == "1/2"
    assert not snapshot_complete(result.path)
    # Serving alone it is incomplete; a cluster's rank 1 loads exactly these files.
    with pytest.raises(ModelNotFound, match="partly"):
        resolve_model(SPLIT_REPO)
    assert resolve_model(SPLIT_REPO, shard_ok=True).path == result.path

    # The other rank's pull completes the model: the marker goes, the model is whole.
    pull(plan_pull(SPLIT_REPO, shard=parse_shard("0/2")))
    [model] = list_models()
    assert model.complete and model.shard is None
    assert read_marker(model.path) is None and verify_model_dir(model.path).ok


@pytest.mark.slow
def test_cli_shard_pull(split_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "pull", SPLIT_REPO, "--shard", "0/2"]) == 0
    err = capsys.readouterr().err
    assert "shard 0/2 (rank 0: layers 2–3)" in err and "ready:" in err
    assert fetched(split_hub) == RANK0
    assert main(["models", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["shard"] == "0/2" and not row["complete"]
    assert main(["models", "pull", SPLIT_REPO, "--shard", "0/2", "--parallel", "tensor"]) == 2
    assert main(["models", "pull", SPLIT_REPO, "--parallel", "pipeline"]) == 2


@pytest.mark.slow
def test_hosts_all_local_pull_everything(split_hub: FakeHub, hub_cache: Path) -> None:
    argv = ["models", "pull", SPLIT_REPO, "--hosts", "127.0.0.1,127.0.0.1"]
    assert main([*argv, "--parallel", "pipeline"]) == 0
    assert fetched(split_hub) == RANK0 | RANK1
    [model] = list_models()
    assert model.complete and model.shard is None
    assert not (model.path / MARKER_FILE).exists()


FAKE_SSH = """#!/bin/bash
# ssh stand-in: drop the options, log the call, run the command here with the host's own store.
while [ $# -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done
host="$1"; shift
echo "$host $*" >> "$FAKE_SSH_ROOT/calls.log"
if [ "$host" = unreachable ]; then echo "ssh: connect to host $host: No route" >&2; exit 255; fi
export HF_HUB_CACHE="$FAKE_SSH_ROOT/$host/hub" MLXLAUNCH_HOME="$FAKE_SSH_ROOT/$host/home"
exec bash -c "$*"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fake `ssh` first on PATH; each "remote" host's store is under the returned root."""
    bin_dir, root = tmp_path / "bin", tmp_path / "remotes"
    bin_dir.mkdir()
    root.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_ROOT", str(root))
    yield root


@pytest.mark.slow
def test_hosts_remote_host_gets_only_its_shard(
    split_hub: FakeHub, hub_cache: Path, fake_ssh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["models", "pull", SPLIT_REPO, "--hosts", "127.0.0.1,10.0.0.2", "--parallel", "pipeline"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "10.0.0.2: " in err and "this machine: " in err
    call = (fake_ssh / "calls.log").read_text()
    assert call.startswith("10.0.0.2 ") and "--shard 1/2" in call and "--revision" in call
    assert snapshot_files(hub_cache) & {f for f in RANK0 | RANK1 if "safetensors" in f} == RANK0
    assert snapshot_files(fake_ssh / "10.0.0.2" / "hub") >= RANK1
    assert not snapshot_files(fake_ssh / "10.0.0.2" / "hub") & {layer_file(2), layer_file(3)}
    gets = [p for m, p, _ in split_hub.requests if m == "GET" and p.endswith(".safetensors")]
    assert sorted(p.rsplit("/", 1)[1] for p in gets) == sorted([*RANK0, *RANK1])
    [here] = list_models()
    assert here.shard == "0/2"


@pytest.mark.slow
def test_a_failing_host_is_named_and_fails_the_pull(
    split_hub: FakeHub, fake_ssh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["models", "pull", SPLIT_REPO, "--hosts", "127.0.0.1,unreachable"]
    assert main([*argv, "--parallel", "pipeline"]) != 0
    err = capsys.readouterr().err
    assert "unreachable: pull failed" in err and "ssh could not reach it" in err
    [here] = list_models()
    assert here.shard == "0/2"  # the reachable host still got its part


@pytest.mark.slow
def test_hostfile_tensor_parallel_pulls_the_whole_model_everywhere(
    split_hub: FakeHub, hub_cache: Path, fake_ssh: Path, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1"}, {"ssh": "mac-2"}]))
    # auto: qwen3_moe has tensor sharding in mlx-lm, so every rank loads every weight.
    assert main(["models", "pull", SPLIT_REPO, "--hostfile", str(hostfile)]) == 0
    assert "--shard" not in (fake_ssh / "calls.log").read_text()
    for cache in (hub_cache, fake_ssh / "mac-2" / "hub"):
        assert snapshot_files(cache) >= RANK0 | RANK1
    [here] = list_models()
    assert here.complete and here.shard is None


@pytest.mark.slow
def test_more_hosts_than_layers_is_refused_before_any_pull(
    split_hub: FakeHub, fake_ssh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = ",".join(["127.0.0.1"] * (LAYERS + 1))
    assert main(["models", "pull", SPLIT_REPO, "--hosts", hosts, "--parallel", "pipeline"]) == 2
    assert "cannot be split over 5 pipeline ranks" in capsys.readouterr().err
    assert fetched(split_hub) == set() and not (fake_ssh / "calls.log").exists()
