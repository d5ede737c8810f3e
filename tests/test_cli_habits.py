"""Habits people bring from Ollama: `mlx pull`, `mlx list`, `mlx run`; agent options typed
before `--`; a model named but not downloaded. Each gets what to type, or the offer to pull."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e.claude_cli import write_fake_claude
from rich.console import Console

from mlxlaunch.cli.main import main
from mlxlaunch.errors import ModelNotFound
from mlxlaunch.launch.integrations import CLAUDE
from mlxlaunch.launch.session import LaunchOptions, launch_agent


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        (["pull", "qwen-coder-7b"], "mlx models pull qwen-coder-7b"),
        (["list"], "mlx models list"),
        (["ls", "--json"], "mlx models list --json"),
        (["recommend", "--memory", "19"], "mlx models recommend --memory 19"),
        (["show", "qwen3-4b"], "mlx models info qwen3-4b"),
        (["rm", "qwen3-4b"], "mlx models rm qwen3-4b"),
        (["run", "qwen3-4b"], "mlx launch claude --model qwen3-4b"),
        (["run"], "mlx launch claude --model MODEL"),
    ],
)
def test_an_ollama_command_says_the_mlx_command(
    typed: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(typed, capsys)
    assert f"No such command '{typed[0]}'" in err and f"In mlx that is: {meant}" in err


def test_a_typo_still_gets_the_close_commands_though_none_is_loaded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "Did you mean 'serve'?" in _error(["serv"], capsys)
    assert "Did you mean 'models'?" in _error(["model"], capsys)


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode"])
def test_an_agents_option_before_the_separator_says_where_it_goes(
    agent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["launch", agent, "-p", "hi"], capsys)
    assert "No such option: -p" in err
    assert f"Options for {agent} itself go after `--`: mlx launch {agent} [OPTIONS] -- -p" in err


def test_an_unknown_option_of_a_command_without_agent_words_is_left_as_click_says_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _error(["serve", "--bogus"], capsys)
    assert "No such option: --bogus" in err and "--`" not in err


@pytest.fixture
def empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLXLAUNCH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
    return tmp_path


@pytest.mark.parametrize(
    ("named", "offered"),
    [("qwen-coder-7b", True), ("mlx-community/Some-Model-4bit", True), ("bogus", False)],
)
def test_a_named_model_that_can_be_pulled_is_offered_for_pulling(
    empty_store: Path, named: str, offered: bool
) -> None:
    asked: list[str | None] = []

    def decline(name: str | None) -> bool:
        asked.append(name)
        return False

    options = LaunchOptions(model=named, agent_bin=str(write_fake_claude(empty_store / "bin")))
    with pytest.raises(ModelNotFound):
        launch_agent(CLAUDE, options, console=Console(file=None), offer_pull=decline)
    assert asked == ([named] if offered else [])


def test_without_a_terminal_nothing_is_asked_and_the_error_says_how_to_pull(
    empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claude = write_fake_claude(empty_store / "bin")
    code = main(["launch", "claude", "--model", "qwen-coder-7b", "--claude-bin", str(claude)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 3 and "mlx models pull qwen-coder-7b" in err and "?" not in err


def test_on_a_terminal_a_named_model_not_downloaded_is_offered_with_its_size(
    empty_store: Path,
) -> None:
    from test_launch_cli import _mlx_on_a_terminal

    claude = write_fake_claude(empty_store / "bin")
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(empty_store / "hub"),
        "MLXLAUNCH_HOME": str(empty_store / "home"),
        "MLXLAUNCH_CONFIG_DIR": str(empty_store / "config"),
        "HF_ENDPOINT": "http://127.0.0.1:9",  # a hub that is not there
    }
    env.pop("HF_HUB_OFFLINE", None)
    args = ["launch", "claude", "--model", "qwen-coder-7b", "--claude-bin", str(claude)]
    code, stderr = _mlx_on_a_terminal(args, env, "n\n")
    said = " ".join(stderr.split())
    assert code == 3, stderr
    assert "qwen-coder-7b is not downloaded. Pull it now (mlx-community/" in said
    assert "4.0 GiB download" in said
    code, stderr = _mlx_on_a_terminal(args, env, "y\n")  # it goes on to pull: no hub here
    assert code == 5 and "cannot reach the hub at http://127.0.0.1:9" in stderr, stderr
