"""The integrations table: what each agent is told, where its files go, and that they go."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mlxlaunch.launch.agent_bin import AgentNotFound, find_agent, npm_install_command, pinned_binary
from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget, agent_environment
from mlxlaunch.launch.claude_env import ClaudeTarget, client_settings, launch_variables
from mlxlaunch.launch.codex_config import TOKEN_VARIABLE, auto_compact_limit, config_toml
from mlxlaunch.launch.integrations import API_PATHS, CLAUDE, CODEX, INTEGRATIONS, OPENCODE
from mlxlaunch.launch.opencode_config import opencode_config
from mlxlaunch.launch.session import agent_launch_dir, prepare_launch_dir

SETTINGS = client_settings("qwen-coder-7b", 32_768)
TARGET = AgentTarget("http://127.0.0.1:8123", "tok-secret", SETTINGS, cwd=Path("/work/proj"))


def test_every_entry_is_complete() -> None:
    assert set(INTEGRATIONS) == {"claude", "codex", "opencode"}
    for agent in INTEGRATIONS.values():
        assert agent.api in API_PATHS
        assert agent.release.version[0].isdigit() and agent.sets
        assert npm_install_command(agent)[-1] == f"{agent.release.package}@{agent.release.version}"
    assert (CLAUDE.api, CODEX.api, OPENCODE.api) == ("messages", "responses", "chat")
    assert CODEX.release.version == "0.171.0"


def test_claude_entry_sets_what_mlx_launch_claude_always_set() -> None:
    setup = CLAUDE.configure(TARGET, Path("/unused"))
    expected = launch_variables(ClaudeTarget.of(TARGET.base_url, TARGET.auth_token, SETTINGS))
    assert dict(setup.env) == expected and not setup.files and not setup.args


def test_codex_config_points_at_responses_with_the_served_limits() -> None:
    config = tomllib.loads(config_toml(TARGET))
    assert config["model_provider"] == "mlx" and config["model"] == SETTINGS.model_id
    provider = config["model_providers"]["mlx"]
    assert provider["base_url"] == "http://127.0.0.1:8123/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == TOKEN_VARIABLE
    assert config["model_context_window"] == 32_768
    limit = config["model_auto_compact_token_limit"]
    assert limit == auto_compact_limit(32_768, SETTINGS.max_output_tokens)
    # Room for one whole reply before the window is full.
    assert 32_768 // 2 <= limit <= 32_768 - SETTINGS.max_output_tokens
    assert config["projects"]["/work/proj"]["trust_level"] == "trusted"
    assert "tok-secret" not in config_toml(TARGET)  # the token lives in the environment only


def test_codex_setup_uses_its_own_home_and_the_token_variable(tmp_path: Path) -> None:
    setup = CODEX.configure(TARGET, tmp_path / "launch")
    assert setup.env["CODEX_HOME"] == str(tmp_path / "launch")
    assert setup.env[TOKEN_VARIABLE] == "tok-secret"
    assert "config.toml" in setup.files and "sessions" in setup.kept_dirs


def test_opencode_config_points_at_chat_completions_with_the_served_limits() -> None:
    setup = OPENCODE.configure(TARGET, Path("/unused"))
    config = json.loads(setup.env["OPENCODE_CONFIG_CONTENT"])
    assert config == opencode_config(TARGET)
    provider = config["provider"]["mlx"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8123/v1"
    assert provider["options"]["apiKey"] == "{env:MLX_LAUNCH_API_KEY}"
    model = provider["models"][SETTINGS.model_id]
    assert model["limit"] == {"context": 32_768, "output": SETTINGS.max_output_tokens}
    assert config["model"] == config["small_model"] == f"mlx/{SETTINGS.model_id}"
    assert setup.env["MLX_LAUNCH_API_KEY"] == "tok-secret"
    assert "tok-secret" not in setup.env["OPENCODE_CONFIG_CONTENT"]


def test_opencode_sends_its_titles_to_a_small_model_served_beside_the_main_one() -> None:
    settings = client_settings("qwen-coder-7b", 32_768, small_model_id="qwen-coder-1.5b")
    config = opencode_config(AgentTarget("http://127.0.0.1:8123", "t", settings))
    assert config["model"] == "mlx/qwen-coder-7b"
    assert config["small_model"] == "mlx/qwen-coder-1.5b"
    assert set(config["provider"]["mlx"]["models"]) == {"qwen-coder-7b", "qwen-coder-1.5b"}
    # Only agents with a background tier get a second model loaded for them.
    assert {a.name for a in INTEGRATIONS.values() if a.small_tier} == {"claude", "opencode"}


def test_environment_drops_provider_switches_and_env_pairs_win() -> None:
    setup = AgentSetup(env={"CODEX_HOME": "/ours", "A": "ours"})
    env = agent_environment(
        setup,
        {"CODEX_HOME": "/theirs", "OPENAI_BASE_URL": "https://elsewhere", "KEEP": "1"},
        drops=CODEX.drops,
        extra={"A": "user"},
    )
    assert env == {"CODEX_HOME": "/ours", "A": "user", "KEEP": "1"}


def test_launch_dir_is_private_and_goes_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    parent = tmp_path / "home" / "agents" / "codex"
    stale = parent / "launch-999999999"  # a killed launch's left-over: no such process
    stale.mkdir(parents=True)
    with agent_launch_dir(CODEX) as launch_dir:
        assert not stale.exists()
        setup = CODEX.configure(TARGET, launch_dir)
        prepare_launch_dir(setup, launch_dir)
        assert stat.S_IMODE(launch_dir.stat().st_mode) == 0o700
        config = launch_dir / "config.toml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert (launch_dir / "sessions").is_symlink()
        (launch_dir / "sessions" / "kept.jsonl").write_text("{}")
    assert not launch_dir.exists()
    assert (parent / "sessions" / "kept.jsonl").exists()  # sessions outlive the launch


def test_agent_lookup_order_and_hint(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    with pytest.raises(AgentNotFound) as missing:
        find_agent(CODEX, path=str(tmp_path), prefix=prefix)
    assert "--install-codex" in (missing.value.hint or "")
    pinned = pinned_binary(CODEX, prefix)
    pinned.parent.mkdir(parents=True)
    pinned.write_text("#!/bin/sh\n")
    pinned.chmod(0o755)
    assert find_agent(CODEX, path=str(tmp_path), prefix=prefix) == pinned
    on_path = tmp_path / "bin" / "codex"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert find_agent(CODEX, path=str(on_path.parent), prefix=prefix) == on_path
    with pytest.raises(AgentNotFound):
        find_agent(CODEX, str(tmp_path / "nope" / "codex"), prefix=prefix)


@pytest.mark.slow
def test_print_config_for_a_server_given_by_url(tmp_path: Path) -> None:
    env = {**os.environ, "MLXLAUNCH_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [
            sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()",
            "launch", "codex", "--print-config", "--url", "http://127.0.0.1:9",
            "--token", "tok", "--context-length", "65536",
        ],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "model_context_window = 65536" in done.stdout
    assert 'base_url = "http://127.0.0.1:9/v1"' in done.stdout
    assert "export MLX_LAUNCH_API_KEY=tok" in done.stdout
