"""The environment that points Claude Code at our server (exact variables and values)."""

from __future__ import annotations

import pytest

from mlxlaunch.launch.claude_env import (
    ClaudeTarget,
    claude_environment,
    claude_model_id,
    export_lines,
    launch_variables,
    max_output_tokens,
    parse_env_pairs,
)

TARGET = ClaudeTarget(
    base_url="http://127.0.0.1:4321/",
    auth_token="secret-token",
    model_id="qwen3-8b",
    context_window=40960,
)


def test_every_variable_and_value() -> None:
    assert launch_variables(TARGET) == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:4321",
        "ANTHROPIC_AUTH_TOKEN": "secret-token",
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": "qwen3-8b",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "qwen3-8b",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "qwen3-8b",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "qwen3-8b",
        "ANTHROPIC_SMALL_FAST_MODEL": "qwen3-8b",
        "CLAUDE_CODE_SUBAGENT_MODEL": "qwen3-8b",
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "40960",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "7480",  # compacts at half the window, not before
        "API_TIMEOUT_MS": "3600000",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }


def test_small_model_maps_only_the_haiku_tier() -> None:
    env = launch_variables(ClaudeTarget("http://h:1", "t", "big", 65536, small_model_id="little"))
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "little"
    assert env["ANTHROPIC_SMALL_FAST_MODEL"] == "little"
    assert {
        env[k]
        for k in (
            "ANTHROPIC_MODEL",
            "ANTHROPIC_DEFAULT_OPUS_MODEL",
            "ANTHROPIC_DEFAULT_SONNET_MODEL",
            "CLAUDE_CODE_SUBAGENT_MODEL",
        )
    } == {"big"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("claude-local", "local-claude-local"),
        ("Claude-3", "local-Claude-3"),
        ("qwen[1m]", "qwen"),
        ("mlx-community/Qwen3-8B-4bit", "mlx-community/Qwen3-8B-4bit"),
        ("[1m]", "local-model"),
    ],
)
def test_model_ids_keep_claude_code_honouring_the_context_window(name: str, expected: str) -> None:
    model_id = claude_model_id(name)
    assert model_id == expected
    assert not model_id.lower().startswith("claude-") and "[1m]" not in model_id


@pytest.mark.parametrize(
    ("window", "expected"), [(4096, 1024), (32768, 3384), (65536, 16384), (262144, 32000)]
)
def test_max_output_fits_the_window(window: int, expected: int) -> None:
    assert max_output_tokens(window) == expected


def test_output_never_exceeds_a_tiny_window() -> None:
    env = launch_variables(ClaudeTarget("http://h:1", "t", "m", 512))
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512"


def test_user_environment_kept_provider_switches_dropped_and_env_pairs_win() -> None:
    inherited = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "ANTHROPIC_API_KEY": "sk-real",
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "CLAUDE_CODE_USE_VERTEX": "1",
        "ANTHROPIC_CUSTOM_HEADERS": "X-A: b",
    }
    target = ClaudeTarget(
        "http://h:1", "t", "m", 40960, extra={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64", "FOO": "bar"}
    )
    env = claude_environment(target, inherited)
    assert env["PATH"] == "/bin" and env["HOME"] == "/home/u"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-A: b"
    assert env["ANTHROPIC_API_KEY"] == ""
    assert "CLAUDE_CODE_USE_BEDROCK" not in env and "CLAUDE_CODE_USE_VERTEX" not in env
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "64"
    assert env["FOO"] == "bar"
    assert inherited["ANTHROPIC_API_KEY"] == "sk-real"  # the caller's mapping is not touched


def test_env_pairs_parse_and_reject() -> None:
    assert parse_env_pairs(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("NOEQUALS", "=v", "1A=x", "A B=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_env_pairs([bad])


def test_export_lines_quote_for_the_shell() -> None:
    text = export_lines({"A": "plain", "B": "", "C": "it's $HOME"})
    assert text.splitlines() == ["export A=plain", "export B=''", "export C='it'\"'\"'s $HOME'"]
