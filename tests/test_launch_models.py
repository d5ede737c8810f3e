"""Which model `mlx launch claude` serves when the user names one, set a default, or neither."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mlxlaunch.config import UserConfig
from mlxlaunch.errors import ModelNotFound
from mlxlaunch.launch.models import ChosenModel, best_local_model, choose_model
from mlxlaunch.store.catalog import catalog_entry, recommend
from mlxlaunch.store.facts import read_facts
from mlxlaunch.store.inventory import LocalModel
from mlxlaunch.store.memory import GIB


def _local(
    name: str, directory: Path, weights: int, *, alias: str | None = None, complete: bool = True
) -> LocalModel:
    facts = replace(read_facts(directory), weights_bytes=weights)
    return LocalModel(
        name=name,
        repo_id=None,
        alias=alias,
        source="local",
        path=directory,
        revision=None,
        refs=(),
        size_on_disk=weights,
        complete=complete,
        facts=facts,
        last_used=None,
    )


@pytest.mark.slow
def test_explicit_name_wins_and_test_models_resolve(tiny_model_dir: Path) -> None:
    chosen = choose_model(
        "tiny",
        UserConfig({"default-model": "qwen3-8b"}),
        local_models=lambda: pytest.fail("must not scan"),
    )
    assert chosen == ChosenModel("tiny", tiny_model_dir, "--model")
    assert chosen.served_id == "tiny"
    assert chosen.context_window() == 40960
    assert chosen.context_window(4096) == 4096


@pytest.mark.slow
def test_default_model_setting_comes_next(tiny_model_dir: Path) -> None:
    chosen = choose_model(
        None,
        UserConfig({"default-model": str(tiny_model_dir)}),
        local_models=lambda: pytest.fail("must not scan"),
    )
    assert chosen.path == tiny_model_dir and chosen.reason == "default-model setting"
    assert chosen.served_id == tiny_model_dir.name  # a path is named by its directory


@pytest.mark.slow
def test_best_local_model_fits_memory_and_prefers_catalog_rank(tiny_model_dir: Path) -> None:
    models = [
        _local("huge", tiny_model_dir, 40 * GIB),
        _local("qwen-coder-7b", tiny_model_dir, 4 * GIB, alias="qwen-coder-7b"),
        _local("qwen3-8b", tiny_model_dir, 5 * GIB, alias="qwen3-8b"),
        _local("unranked-big", tiny_model_dir, 6 * GIB),
        _local("half-pulled", tiny_model_dir, 1 * GIB, alias="qwen3-14b", complete=False),
    ]
    coder, general = catalog_entry("qwen-coder-7b"), catalog_entry("qwen3-8b")
    assert coder is not None and general is not None
    expected = max((coder, general), key=lambda e: e.rank).alias
    best = best_local_model(models, total_memory=16 * GIB)
    assert best is not None and best.name == expected  # huge won't fit; unranked loses
    assert best_local_model(models, total_memory=2 * GIB) is None
    chosen = choose_model(None, UserConfig(), local_models=lambda: models, total_memory=16 * GIB)
    assert chosen.reason == "best downloaded model" and chosen.name == expected


def test_nothing_downloaded_names_the_pull_command() -> None:
    with pytest.raises(ModelNotFound) as info:
        choose_model(None, UserConfig(), local_models=list, total_memory=16 * GIB)
    best = recommend(16 * GIB)
    assert best is not None and info.value.hint is not None
    assert f"mlx models pull {best.alias}" in info.value.hint


def test_unknown_name_is_model_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFound, match="not downloaded"):
        choose_model("qwen3-8b", UserConfig())
