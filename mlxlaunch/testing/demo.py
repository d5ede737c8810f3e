"""The `demo` model's replies: short, fixed and honest, with a real tool round trip.

The demo model has random weights, so left alone it writes noise until its output cap. Instead
its replies are scripted at the model boundary (like the tests' :class:`ScriptedOutput`), chosen
from the request: a greeting that says what the demo is, a shell tool call when asked to create
a file or run a command, a report of the tool's result when it comes back, and JSON that fits a
requested schema (Claude Code's session-title request). Everything after the logits — sampling,
the tool-call parser, streaming, the prefix cache, the agent itself — runs for real.

Every agent names its shell tool differently (Claude Code `Bash` with `command`, Codex
`exec_command` with `cmd`, opencode `bash` with a required `description`, older Codex `shell`
with an argv): the tool is found by its role, a command field in its schema, and its arguments
are filled from that schema, so an agent not listed here gets the round trip too.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolSpec
from mlxlaunch.testing.scripted import ForcedTokens, LogitsProcessor, eos_token_id_of

DEMO_FILE_TEXT = "Hello from the mlxlaunch demo"
DEFAULT_DEMO_FILE = "hello.txt"

# Claude Code wraps context it adds to a user turn in these; they are not what the user typed.
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_FILE_NAME = re.compile(r"\b([\w][\w.-]*\.[A-Za-z0-9]{1,8})\b")
_WANTS_TOOL = re.compile(
    r"\b(create|write|make|touch|save|run|execute|bash|shell|command|tool|file)\b", re.I
)
# How much of a tool's output the reply quotes back.
_QUOTE_CHARS = 160


# The fields a shell tool takes its command in, and names that say a tool is a shell (the
# stronger sign) or runs something (a weaker one: Claude Code's `Skill` or `SlashCommand`).
_COMMAND_FIELDS = ("command", "cmd")
_SHELL_NAME = re.compile(r"bash|shell|exec|terminal", re.I)
_RUNS_NAME = re.compile(r"command|run", re.I)
DEMO_DESCRIPTION = "Run a command for the mlxlaunch demo"


@dataclass(frozen=True)
class ShellTool:
    """The tool of a request that runs a shell command, and how its arguments are shaped."""

    name: str
    field: str  # the property that holds the command
    argv: bool  # the command is a list of words (`["bash", "-lc", cmd]`), not one string
    schema: dict[str, Any]

    def arguments(self, command: str) -> dict[str, Any]:
        """Arguments for running `command`: the command, a description where the tool has
        one, and a fitting value for every other field it requires."""
        properties = self.schema.get("properties") or {}
        required = self.schema.get("required") or []
        arguments: dict[str, Any] = {self.field: ["bash", "-lc", command] if self.argv else command}
        if "description" in properties:
            arguments["description"] = DEMO_DESCRIPTION
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and name not in arguments and name in properties:
                arguments[name] = value_for(properties[name])
        return arguments


def _command_field(schema: dict[str, Any]) -> tuple[str, bool] | None:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    for name in _COMMAND_FIELDS:
        field = properties.get(name)
        if not isinstance(field, dict):
            continue
        kind = field.get("type")
        if kind == "string" or (kind is None and "items" not in field):
            return name, False
        if kind == "array" and (field.get("items") or {}).get("type", "string") == "string":
            return name, True
    return None


def shell_tool(tools: Sequence[ToolSpec]) -> ShellTool | None:
    """The tool among `tools` that runs a shell command, found by its role: a command field in
    its schema, and a name that says shell (`Bash`, `exec_command`, `shell`) or, failing
    that, a command the tool requires. None when no tool runs commands."""
    ranked: list[tuple[int, ShellTool]] = []
    for tool in tools:
        found = _command_field(tool.parameters)
        if found is None:
            continue
        required = tool.parameters.get("required") or []
        rank = 2 if _SHELL_NAME.search(tool.name) else 1 if _RUNS_NAME.search(tool.name) else 0
        if rank == 0 and found[0] not in required:
            continue  # a field named `command` in some other tool's options
        ranked.append((rank, ShellTool(tool.name, found[0], found[1], tool.parameters)))
    return max(ranked, key=lambda pair: pair[0])[1] if ranked else None


def greeting(pull_hint: str | None, agent: str | None = None, *, can_run: bool = False) -> str:
    """The demo's answer to anything that is not a tool request.

    `agent`: the agent `mlx launch` started (None: `mlx serve`, any client); `can_run`: the
    request offers a shell tool, so the tool round trip can be shown.
    """
    launch = f"mlx launch {agent or '<agent>'} --model <name>"
    real = (
        f"For real work pull a model (`{pull_hint}`) and launch it with `{launch}`."
        if pull_hint
        else "For real work pick a model (`mlx models catalog`) and pull it with "
        f"`mlx models pull <name>`, then `{launch}`."
    )
    trip = 'Ask me to "create a file hello.txt" to see a tool round trip. ' if can_run else ""
    return (
        "Hi! I am mlxlaunch's demo model: random weights with scripted replies, so what you see "
        "is the real plumbing (server, streaming, prefix cache, tool calls) and none of it is "
        "intelligence. " + trip + real
    )


def last_user_text(messages: list[ChatMessage]) -> str:
    """What the user last typed, without the reminders Claude Code adds to the turn."""
    for message in reversed(messages):
        if message.role == "user":
            return _REMINDER.sub("", message.content).strip()
    return ""


def demo_command(prompt: str) -> str:
    """The shell command the demo runs for a prompt: a backticked command if the user gave
    one, else writing a small file named in the prompt (or ``hello.txt``)."""
    quoted = _BACKTICKED.search(prompt)
    if quoted:
        return quoted.group(1).strip()
    named = _FILE_NAME.search(prompt)
    name = named.group(1) if named else DEFAULT_DEMO_FILE
    return f"echo {shlex.quote(DEMO_FILE_TEXT)} > {shlex.quote(name)}"


def value_for(schema: Any) -> Any:
    """A small value that satisfies the simple JSON schemas clients ask for."""
    if not isinstance(schema, dict):
        return "mlxlaunch demo"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for(options[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: value_for(sub) for name, sub in properties.items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return max(0, int(schema.get("minimum", 0)))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "mlxlaunch demo"


def tool_call_markup(name: str, arguments: dict[str, Any]) -> str:
    """A call in the demo model's own (Qwen/Hermes) tool-call syntax."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def reply_for(
    request: GenerationRequest, pull_hint: str | None = None, agent: str | None = None
) -> str:
    """The demo's whole reply to one request, as the model would write it."""
    # The demo's template opens a think span when thinking is on: close it with a short thought.
    opening = "The demo answers from a script.\n</think>\n\n" if request.thinking else ""
    if request.response_schema is not None:
        # JSON as the schema grammar writes it (llguidance's ", " and ": " separators): a
        # scripted reply must keep to the grammar, which now fails a request that leaves it.
        body = json.dumps(value_for(request.response_schema))
        return opening + body
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "tool":
        output = " ".join(last.content.split())
        if len(output) > _QUOTE_CHARS:
            output = output[:_QUOTE_CHARS] + "…"
        outcome = "reported an error" if last.is_error else "ran"
        shown = f": {output}" if output else " (no output)"
        return opening + (
            f"The {last.name or 'tool'} call {outcome}{shown}. That was a full tool round trip "
            "through mlxlaunch: the call was parsed from the model's output, your client ran "
            "it, and its result came back in the next request, which the prefix cache served "
            "without prefilling the conversation again."
        )
    prompt = last_user_text(request.messages)
    shell = shell_tool(request.tools) if request.tool_choice.mode != "none" else None
    if shell is not None and _WANTS_TOOL.search(prompt):
        command = demo_command(prompt)
        markup = tool_call_markup(shell.name, shell.arguments(command))
        return opening + f"I will run `{command}`.\n" + markup
    return opening + greeting(pull_hint, agent, can_run=shell is not None)


class DemoReplies:
    """The engine ``logits_hook`` for ``--model demo``: forces :func:`reply_for`'s text."""

    def __init__(self, pull_hint: str | None = None, agent: str | None = None) -> None:
        self.pull_hint = pull_hint
        self.agent = agent

    def __call__(self, request: Any, tokenizer: Any) -> list[LogitsProcessor] | None:
        if not isinstance(request, GenerationRequest):
            return None
        text = reply_for(request, self.pull_hint, self.agent)
        tokens = list(tokenizer.encode(text, add_special_tokens=False))
        return [ForcedTokens(tokens, eos_token_id_of(tokenizer))]
