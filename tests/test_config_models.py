"""`mlx config set default-model NAME` is checked against the models mlx knows, as the README
says settings are; a launch that cannot find the setting's model says it came from there."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.claude_cli import write_fake_claude
from local_store import write_store

from mlxlaunch import config
from mlxlaunch.cli.main import main


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private config, home and hub cache holding the local_store models."""
    monkeypatch.setenv(config.CONFIG_DIR_ENV, str(tmp_path / "cfg"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_store(tmp_path / "hub")
    return tmp_path


def _set(value: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["config", "set", "default-model", value])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_a_name_no_model_answers_to_is_refused_and_not_stored(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _set("bogus", capsys)
    assert code == 3 and "cannot set default-model: unknown model 'bogus'" in said
    assert config.load_config().default_model is None
    code, said = _set(str(store / "no-such-dir"), capsys)
    assert code == 3 and config.load_config().default_model is None


@pytest.mark.parametrize("name", ["demo", "qwen3-4b", "qwen-coder-7b"])
def test_known_names_are_stored(name: str, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, said = _set(name, capsys)
    assert code == 0 and config.load_config().default_model == name
    assert "not downloaded" not in said  # the two catalog models are in the store


def test_an_alias_or_repo_not_downloaded_yet_is_stored_with_the_pull_command(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _set("qwen3-coder-30b", capsys)
    assert code == 0 and "not downloaded yet: mlx models pull qwen3-coder-30b" in said
    code, said = _set("some-org/Some-Model-4bit", capsys)
    assert code == 0 and config.load_config().default_model == "some-org/Some-Model-4bit"


def test_a_directory_is_stored_as_its_absolute_path(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = store / "models" / "mine"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    monkeypatch.chdir(store / "models")
    code, _ = _set("./mine", capsys)
    assert code == 0 and config.load_config().default_model == str(model.resolve())


def test_a_launch_whose_setting_names_a_missing_model_says_the_setting_is_why(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config.config_path()
    path.parent.mkdir(parents=True)
    path.write_text('default-model = "gone-model"\n')  # a hand edit, or a model removed since
    claude = write_fake_claude(store / "bin")
    assert main(["launch", "claude", "--claude-bin", str(claude)]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"'gone-model' is the default-model setting in {path}" in err
    assert "mlx config set default-model NAME, or mlx config unset default-model" in err
