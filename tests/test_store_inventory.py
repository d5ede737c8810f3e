"""The local inventory: list, info facts, rm (and its refusal), resolve, registered dirs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakehub import TINY_REPO, FakeHub, serve_test_repos

from mlxlaunch.cli.error_text import error_text
from mlxlaunch.errors import ModelNotFound
from mlxlaunch.store import (
    ModelInUse,
    execute_removal,
    list_models,
    plan_pull,
    plan_removal,
    pull,
    read_facts,
    register_local,
    resolve_model,
    running_servers,
)
from mlxlaunch.store.verify import verify_model_dir

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "home"


@pytest.fixture
def pulled(home: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tiny repo pulled from a fake hub; yields its snapshot directory."""
    with FakeHub() as hub:
        serve_test_repos(hub, tiny_model_dir)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield pull(plan_pull(TINY_REPO)).path


def _write_run_record(home: Path, pid: int, model_path: Path) -> None:
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": pid,
        "url": "http://127.0.0.1:4321",
        "token": "secret-token",
        "model": TINY_REPO,
        "model_path": str(model_path),
        "started_at": 1.0,
    }
    (run / f"{pid}.json").write_text(json.dumps(record))


def _parameters(model: Any) -> int:
    from mlx.utils import tree_flatten

    flat: Any = tree_flatten(model.parameters())
    return sum(int(v.size) for _, v in flat)


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def test_facts_come_from_files(tiny_model_dir: Path) -> None:
    facts = read_facts(tiny_model_dir)
    import mlx_lm

    model = mlx_lm.load(str(tiny_model_dir))[0]
    assert facts.param_count == _parameters(model)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert facts.context_window == config["max_position_embeddings"]
    assert facts.quant_bits is None and facts.dtype == "f32"
    assert facts.architecture_supported and facts.has_tokenizer
    assert facts.tool_format == "json_tools"  # the qwen template's <tool_call> JSON
    assert facts.thinking
    assert facts.template.tools and facts.problems() == []


def test_quantized_facts_count_unpacked_parameters(tiny_model_dir: Path, tmp_path: Path) -> None:
    import mlx_lm
    from mlx_lm.utils import quantize_model, save_model

    loaded: Any = mlx_lm.load(str(tiny_model_dir), return_config=True)
    model, _, config = loaded
    full = _parameters(model)
    qmodel, qconfig = quantize_model(model, config, group_size=32, bits=4)
    out = tmp_path / "q4"
    save_model(out, qmodel)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    (out / "config.json").write_text(json.dumps(qconfig))
    facts = read_facts(out)
    assert facts.quant_bits == 4
    assert facts.param_count == full
    assert verify_model_dir(out).ok


def test_verify_catches_truncated_weights_and_a_broken_template(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    tok_config = json.loads((broken / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = "{% for m in messages %}{{ m.content }"
    (broken / "tokenizer_config.json").write_text(json.dumps(tok_config))
    problems = verify_model_dir(broken).problems
    assert any("model.safetensors is" in p for p in problems)
    assert any("chat template does not render" in p for p in problems)


def test_list_shows_pulled_and_registered_models(
    pulled: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    own = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, own)
    register_local("mine", own)
    models = {m.name: m for m in list_models()}
    assert set(models) == {TINY_REPO, "mine"}
    hub_model, local = models[TINY_REPO], models["mine"]
    assert hub_model.source == "hub" and hub_model.path == pulled and hub_model.complete
    assert hub_model.size_on_disk == sum(p.stat().st_size for p in tiny_model_dir.iterdir())
    assert local.source == "local" and local.path == own.resolve()
    assert local.facts.param_count == hub_model.facts.param_count
    record = hub_model.as_json()
    assert record["repo_id"] == TINY_REPO and record["tool_format"] == "json_tools"
    json.dumps(record)  # JSON-ready


def test_resolve_finds_every_kind_of_name(pulled: Path, tiny_model_dir: Path) -> None:
    assert resolve_model(TINY_REPO).source == "repo"
    assert resolve_model(TINY_REPO.upper()).path == pulled  # hub ids ignore case
    assert resolve_model(str(tiny_model_dir)).source == "path"
    register_local("mine", tiny_model_dir)
    assert resolve_model("mine").path == tiny_model_dir.resolve()
    with pytest.raises(ModelNotFound) as missing:
        resolve_model("qwen-coder-7b")  # a catalog alias, not pulled
    assert missing.value.hint is None  # the store names no command: the CLI's table does
    assert error_text(missing.value)[1] == "download it first: mlx models pull qwen-coder-7b"
    with pytest.raises(ModelNotFound, match="unknown model"):
        resolve_model("what-is-this")


def test_resolve_records_last_use(pulled: Path) -> None:
    resolve_model(TINY_REPO, record_use=True)
    [model] = list_models()
    assert model.last_used is not None


def test_rm_frees_the_files_and_the_model_leaves_the_list(pulled: Path) -> None:
    removal = plan_removal(TINY_REPO)
    assert removal.deletes_files and removal.freed_bytes > 2_000_000
    assert execute_removal(removal) == removal.freed_bytes
    assert not removal.target.exists()
    assert list_models() == []
    with pytest.raises(ModelNotFound):
        resolve_model(TINY_REPO)


def test_rm_refuses_a_model_a_running_server_has_loaded(pulled: Path, home: Path) -> None:
    import os

    _write_run_record(home, os.getpid(), pulled)
    [server] = running_servers()
    assert server.model_path == pulled
    assert "token" not in vars(server)  # the store's view never carries the secret
    with pytest.raises(ModelInUse, match="loaded by a running server"):
        plan_removal(TINY_REPO)
    assert pulled.exists()


def test_rm_ignores_records_of_dead_servers(pulled: Path, home: Path) -> None:
    _write_run_record(home, _dead_pid(), pulled)
    assert running_servers() == []
    execute_removal(plan_removal(TINY_REPO))
    assert list_models() == []


def test_rm_of_a_registered_directory_only_forgets_it(home: Path, tiny_model_dir: Path) -> None:
    register_local("mine", tiny_model_dir)
    removal = plan_removal("mine")
    assert not removal.deletes_files
    execute_removal(removal)
    assert list_models() == [] and (tiny_model_dir / "model.safetensors").exists()


def test_rm_of_an_unknown_model_is_not_found(home: Path) -> None:
    with pytest.raises(ModelNotFound, match="no local model"):
        plan_removal("test-org/never-pulled")
