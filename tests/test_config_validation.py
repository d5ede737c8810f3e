"""Settings are checked when set and when the file is read: a bad value is refused with its
reason (exit 2), never accepted and then failing every launch (`internal error`, exit 70)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from mlxlaunch import config
from mlxlaunch.errors import ConfigError


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {config.CONFIG_DIR_ENV: str(tmp_path / "cfg")}


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The config directory the in-process CLI uses."""
    directory = tmp_path / "cfg"
    monkeypatch.setenv(config.CONFIG_DIR_ENV, str(directory))
    return directory


def _hand_edit(env: dict[str, str], text: str) -> Path:
    path = config.config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("value", ["1", "100", "16383"])
def test_a_context_length_claude_code_cannot_use_is_refused_with_the_reason(
    env: dict[str, str], value: str
) -> None:
    with pytest.raises(ConfigError, match="context-length") as refused:
        config.set_value("context-length", value, env)
    assert "16384" in refused.value.message
    assert "Claude Code's system prompt and tools alone take ~15k tokens" in refused.value.message
    assert not config.config_path(env).exists()


def test_context_lengths_from_the_minimum_up_are_kept(env: dict[str, str]) -> None:
    assert config.set_value("context-length", "16384", env) == 16384
    assert config.set_value("context-length", " 131072 ", env) == 131072
    assert config.load_config(env).get("context-length") == 131072
    with pytest.raises(ConfigError, match="whole number"):
        config.set_value("context-length", "32k", env)


@pytest.mark.parametrize("value", ["5x", "", "soon", "30 minutes"])
def test_keep_alive_is_read_by_the_engines_duration_parser(env: dict[str, str], value: str) -> None:
    with pytest.raises(ConfigError, match=r"keep-alive.*not a duration") as refused:
        config.set_value("keep-alive", value, env)
    assert "30m" in refused.value.message  # the accepted forms


@pytest.mark.parametrize("value", ["30m", "2h", "90s", "0", "never"])
def test_keep_alive_durations_are_stored_as_written(env: dict[str, str], value: str) -> None:
    assert config.set_value("keep-alive", value, env) == value
    assert config.load_config(env).get("keep-alive") == value


def test_ports_cover_0_to_65535(env: dict[str, str]) -> None:
    assert config.set_value("port", "0", env) == 0  # any free port
    assert config.set_value("port", "65535", env) == 65535
    for bad in ("65536", "-1", "http"):
        with pytest.raises(ConfigError, match="port"):
            config.set_value("port", bad, env)


@pytest.mark.parametrize("key", ["default-model", "small-model"])
def test_model_names_must_not_be_empty(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match="non-empty"):
        config.set_value(key, "   ", env)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("context-length = 1", "context-length"),
        ('keep-alive = "5x"', "keep-alive"),
        ("port = 70000", "port"),
        ('default-model = ""', "default-model"),
    ],
)
def test_a_bad_value_in_a_hand_edited_file_names_the_file_and_the_key(
    env: dict[str, str], line: str, key: str
) -> None:
    path = _hand_edit(env, line + "\n")
    with pytest.raises(ConfigError) as refused:
        config.load_config(env)
    assert str(path) in refused.value.message and key in refused.value.message
    assert refused.value.hint is not None and f"mlx config unset {key}" in refused.value.hint


# --- the command line ----------------------------------------------------------------------


def test_config_set_refuses_with_exit_2_and_the_reason(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    assert main(["config", "set", "context-length", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot set context-length to '1'" in err and "~15k tokens" in err
    assert main(["config", "set", "keep-alive", "5x"]) == 2
    assert "not a duration" in capsys.readouterr().err


def test_config_show_json_lists_every_setting(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    assert main(["config", "set", "context-length", "32768"]) == 0
    capsys.readouterr()
    assert main(["config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(cli_env / config.CONFIG_FILENAME)
    assert shown["settings"] == {key: None for key in config.KEYS} | {"context-length": 32768}


@pytest.mark.parametrize("command", ["set", "get", "unset", "show"])
def test_every_config_command_has_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    assert main(["config", command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "Examples:" in text and f"mlx config {command}" in text


def test_the_context_length_option_follows_the_same_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mlxlaunch.cli.main import main

    assert main(["launch", "claude", "--context-length", "100"]) == 2  # before anything loads
    err = " ".join(capsys.readouterr().err.split())
    assert "--context-length" in err and "below the minimum of 16384" in err
    # `mlx serve` serves other clients too: a small window is warned about (tests/
    # test_serve_cli.py), only one that holds nothing is refused.
    assert main(["serve", "--model", "tiny", "--context-length", "1"]) == 2
    assert "--context-length" in " ".join(capsys.readouterr().err.split())


def test_launch_with_a_bad_hand_edited_setting_is_a_config_error_not_an_internal_one(
    cli_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    claude = tmp_path / "claude"
    claude.write_text("#!/bin/sh\nexit 0\n")
    claude.chmod(claude.stat().st_mode | stat.S_IEXEC)
    path = _hand_edit({config.CONFIG_DIR_ENV: str(cli_env)}, "context-length = 1\n")
    code = main(["launch", "claude", "--claude-bin", str(claude), "--model", "tiny"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    # The path is longer than the 80 columns the message is wrapped to under pytest-xdist's
    # per-worker temporary directories: look for it with the wrapping taken out.
    assert str(path) in "".join(err.split()), err
    assert "context-length" in err and "internal error" not in err
