"""Turning a tool-call span into `ToolCallEvent`s with the model family's mlx-lm parser.

mlx-lm's parsers (`mlx_lm/tool_parsers/*.py`) take the text between the family's
`tool_call_start` and `tool_call_end` (markers stripped) plus the tools in OpenAI shape, and
return one call or a list of calls, each a dict with `name` and `arguments` (a dict, sometimes a
JSON string; a few also carry an `id`). They raise ValueError, JSONDecodeError, IndexError… on
text they cannot read. This module hides those differences: a span yields a list of complete
calls, or None when any part of it is unreadable.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Sequence
from typing import Any

from mlxlaunch.engine.types import ToolCallEvent, ToolSpec

ToolParser = Callable[[str, Any], Any]

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_use_id() -> str:
    """A fresh Anthropic-style tool-use id: `toolu_` and 24 random base62 characters."""
    return "toolu_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def parser_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]] | None:
    """The tools in the OpenAI shape mlx-lm's parsers read for argument types (None: no tools)."""
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


def parse_tool_calls(
    body: str, parser: ToolParser, tools: list[dict[str, Any]] | None
) -> list[ToolCallEvent] | None:
    """Parse one tool-call span; None if the parser fails or any call in it is unusable.

    All or nothing: a span with one good and one broken call is returned to the client as text
    rather than half-executed.
    """
    try:
        parsed = parser(body, tools)
    except Exception:  # model output is untrusted: any parser failure means "not a call"
        return None
    calls = parsed if isinstance(parsed, list) else [parsed]
    events: list[ToolCallEvent] = []
    for call in calls:
        normalised = _name_and_arguments(call)
        if normalised is None:
            return None
        name, arguments = normalised
        events.append(ToolCallEvent(id=new_tool_use_id(), name=name, arguments=arguments))
    return events or None


def _name_and_arguments(call: object) -> tuple[str, str] | None:
    """(name, JSON text of the arguments object) from one parsed call, or None."""
    if not isinstance(call, dict):
        return None
    if isinstance(call.get("function"), dict) and "name" not in call:
        call = call["function"]  # OpenAI shape {"function": {"name", "arguments"}}
        assert isinstance(call, dict)
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    # Hermes-style JSON sometimes says "parameters" where the template said "arguments".
    arguments = call["arguments"] if "arguments" in call else call.get("parameters")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None  # Anthropic tool input must be an object
    try:
        # allow_nan=False: NaN/Infinity are not JSON and would break the client's parser.
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return name.strip(), text
