"""The demo model serves every agent `mlx launch` starts: it finds the request's shell tool by
its role (Claude Code's `Bash`, Codex's `exec_command`, opencode's `bash`, an argv `shell`),
fills that tool's own arguments, and its greeting names the agent it serves.

The tool lists are the agents' own: Claude Code's and Codex's from their captured requests
(tests/fixtures), opencode's `bash` as opencode 1.18 declares it. No model is loaded here; the
served path is tests/e2e/test_demo_agents.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolSpec
from mlxlaunch.testing.demo import DEMO_FILE_TEXT, greeting, reply_for, shell_tool

FIXTURES = Path(__file__).parent / "fixtures"

OPENCODE_BASH = ToolSpec(
    "bash",
    "Executes a given bash command in a persistent shell session",
    {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "workdir": {"type": "string", "description": "The working directory"},
            "description": {"type": "string", "description": "What it does in 5-10 words"},
        },
        "required": ["command", "description"],
    },
)
ARGV_SHELL = ToolSpec(
    "shell",
    "Runs a shell command and returns its output.",
    {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
        },
        "required": ["command"],
    },
)


def claude_code_tools() -> list[ToolSpec]:
    body = json.loads((FIXTURES / "claude-code-2.1.332" / "print-mode-request.json").read_text())
    return [ToolSpec(t["name"], "", t["input_schema"]) for t in body["body"]["tools"]]


def codex_tools() -> list[ToolSpec]:
    body = json.loads((FIXTURES / "codex-0.171.0" / "responses-request-0.json").read_text())
    return [
        ToolSpec(t["name"], t.get("description", ""), t["parameters"])
        for t in body["tools"]
        if t.get("type") == "function"
    ]


def _request(prompt: str, tools: list[ToolSpec], **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", prompt)], max_tokens=256, tools=tools, **kw
    )


def _call(text: str) -> dict[str, Any]:
    start, end = text.index("<tool_call>") + len("<tool_call>"), text.index("</tool_call>")
    return dict(json.loads(text[start:end]))


@pytest.mark.parametrize(
    ("agent", "tools", "name", "field"),
    [
        ("claude", claude_code_tools(), "Bash", "command"),
        ("codex", codex_tools(), "exec_command", "cmd"),
        ("opencode", [OPENCODE_BASH], "bash", "command"),
    ],
)
def test_each_agents_shell_tool_is_called_with_arguments_its_schema_accepts(
    agent: str, tools: list[ToolSpec], name: str, field: str
) -> None:
    found = shell_tool(tools)
    assert found is not None and (found.name, found.field) == (name, field)
    call = _call(reply_for(_request("create the file proof.txt", tools), agent=agent))
    assert call["name"] == name
    assert call["arguments"][field] == f"echo '{DEMO_FILE_TEXT}' > proof.txt"
    schema = next(t.parameters for t in tools if t.name == name)
    jsonschema.validate(call["arguments"], schema)  # opencode's required description too


def test_an_argv_shell_tool_gets_a_list_of_words() -> None:
    call = _call(reply_for(_request("run `ls -la`", [ARGV_SHELL])))
    assert call == {"name": "shell", "arguments": {"command": ["bash", "-lc", "ls -la"]}}


def test_tools_that_only_mention_a_command_are_not_taken_for_a_shell() -> None:
    # Claude Code's `Workflow` has an optional `script`, `Skill` an `args`: neither is a shell.
    others = [t for t in claude_code_tools() if t.name != "Bash"]
    assert shell_tool(others) is None
    assert shell_tool([ToolSpec("configure", "", {"properties": {"command": {}}})]) is None
    assert "<tool_call>" not in reply_for(_request("create the file proof.txt", others))


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode"])
def test_the_greeting_names_the_agent_it_serves(agent: str) -> None:
    text = reply_for(_request("hi", codex_tools()), "mlx models pull qwen-coder-1.5b", agent)
    assert f"mlx launch {agent} --model <name>" in text
    others = {"claude", "codex", "opencode"} - {agent}
    assert not any(f"mlx launch {other}" in text for other in others)
    assert "tool round trip" in text  # it offers a shell tool, so the demo says what to try


def test_without_a_shell_tool_the_greeting_does_not_offer_a_round_trip() -> None:
    text = reply_for(_request("create the file proof.txt", []))
    assert text == greeting(None) and "tool round trip" not in text
    assert "mlx launch <agent> --model <name>" in text  # `mlx serve`: any client
