"""The user config file behind `mlx config set/get` and the default model."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mlxlaunch import config
from mlxlaunch.errors import ConfigError


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {config.CONFIG_DIR_ENV: str(tmp_path / "cfg")}


def test_missing_file_means_no_settings(env: dict[str, str]) -> None:
    loaded = config.load_config(env)
    assert loaded.default_model is None
    assert loaded.get("port") is None


def test_set_then_load_round_trips_typed_values(env: dict[str, str]) -> None:
    config.set_value("default-model", "qwen3-8b", env)
    config.set_value("port", "8123", env)
    loaded = config.load_config(env)
    assert loaded.default_model == "qwen3-8b"
    assert loaded.get("port") == 8123
    # The file is plain TOML a user can read and edit.
    raw = tomllib.loads(config.config_path(env).read_text())
    assert raw == {"default-model": "qwen3-8b", "port": 8123}


def test_values_with_quotes_survive(env: dict[str, str]) -> None:
    config.set_value("default-model", '/models/my "odd" dir\\x', env)
    assert config.load_config(env).default_model == '/models/my "odd" dir\\x'


def test_unset_removes_only_that_key(env: dict[str, str]) -> None:
    config.set_value("default-model", "a", env)
    config.set_value("small-model", "b", env)
    assert config.unset_value("default-model", env) is True
    assert config.unset_value("default-model", env) is False
    loaded = config.load_config(env)
    assert loaded.default_model is None
    assert loaded.get("small-model") == "b"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("port", "-1"),
        ("port", "70000"),
        ("port", "x"),
        ("context-length", "-5"),
        ("default-model", "  "),
    ],
)
def test_bad_values_are_refused(env: dict[str, str], key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        config.set_value(key, value, env)
    assert not config.config_path(env).exists()


def test_unknown_key_names_the_known_ones(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        config.set_value("default_model", "x", env)
    assert info.value.hint is not None and "default-model" in info.value.hint


def test_unknown_keys_in_the_file_are_kept(env: dict[str, str]) -> None:
    path = config.config_path(env)
    path.parent.mkdir(parents=True)
    path.write_text('future-key = "keep me"\n')
    config.set_value("default-model", "m", env)
    raw = tomllib.loads(path.read_text())
    assert raw["future-key"] == "keep me"
    assert config.load_config(env).default_model == "m"


def test_broken_file_is_a_config_error_with_its_path(env: dict[str, str]) -> None:
    path = config.config_path(env)
    path.parent.mkdir(parents=True)
    path.write_text("default-model = \n")
    with pytest.raises(ConfigError, match=r"config\.toml"):
        config.load_config(env)


def test_config_dir_defaults_to_platform_dir() -> None:
    assert config.config_dir({}).name == "mlxlaunch"


def test_config_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    monkeypatch.setenv(config.CONFIG_DIR_ENV, str(tmp_path / "cfg"))
    assert main(["config", "get", "default-model"]) == 1  # unset
    assert main(["config", "set", "default-model", "qwen-coder-7b"]) == 0
    assert main(["config", "set", "port", "nope"]) == 2  # ConfigError
    capsys.readouterr()
    assert main(["config", "get", "default-model"]) == 0
    assert capsys.readouterr().out.strip() == "qwen-coder-7b"
    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert "default-model" in shown and "qwen-coder-7b" in shown and "keep-alive" in shown
    assert main(["config", "unset", "default-model"]) == 0
    assert config.load_config().default_model is None
