"""Turning a tool-call span into `ToolCallEvent`s with the model family's mlx-lm parser.

mlx-lm's parsers (`mlx_lm/tool_parsers/*.py`) take the text between the family's
`tool_call_start` and `tool_call_end` (markers stripped) plus the tools in OpenAI shape, and
return one call or a list of calls, each a dict with `name` and `arguments` (a dict, sometimes a
JSON string; a few also carry an `id`). They raise ValueError, JSONDecodeError, IndexError… on
text they cannot read. This module hides those differences: a span yields a list of complete
calls, or None when any part of it is unreadable. Families with a streaming reader of our own
(`json_readers`, `param_readers`, `harmony`) do not come here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlxlaunch.engine.output.spans import ParsedCall, SpanParser, arguments_text
from mlxlaunch.engine.types import ToolSpec

ToolParser = Callable[[str, Any], Any]


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


def mlx_lm_span_parser(parser: ToolParser, tools: Sequence[ToolSpec]) -> SpanParser:
    """A whole-span parser over one of mlx-lm's family parsers."""
    shaped = parser_tools(tools)
    return lambda body: parse_tool_calls(body, parser, shaped)


def parse_tool_calls(
    body: str, parser: ToolParser, tools: list[dict[str, Any]] | None
) -> list[ParsedCall] | None:
    """Parse one tool-call span; None if the parser fails or any call in it is unusable.

    All or nothing: a span with one good and one broken call is returned to the client as text
    rather than half-executed.
    """
    try:
        parsed = parser(body, tools)
    except Exception:  # model output is untrusted: any parser failure means "not a call"
        return None
    calls = parsed if isinstance(parsed, list) else [parsed]
    out: list[ParsedCall] = []
    for call in calls:
        normalised = parsed_call(call)
        if normalised is None:
            return None
        out.append(normalised)
    return out or None


def parsed_call(call: object) -> ParsedCall | None:
    """A call from `{"name", "arguments" | "parameters", "id"?}` (or OpenAI's
    `{"id"?, "function": {...}}`): its name, the JSON text of its arguments object and the id
    it carries; None when it is not a usable call."""
    if not isinstance(call, dict):
        return None
    model_id = call.get("id") if isinstance(call.get("id"), str) else None
    if isinstance(call.get("function"), dict) and "name" not in call:
        call = call["function"]  # OpenAI shape {"function": {"name", "arguments"}}
        assert isinstance(call, dict)
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    # Hermes-style JSON sometimes says "parameters" where the template said "arguments".
    arguments = call["arguments"] if "arguments" in call else call.get("parameters")
    text = arguments_text({} if arguments is None else arguments)
    if text is None:
        return None  # Anthropic tool input must be an object
    return ParsedCall(name=name.strip(), arguments=text, model_id=model_id or None)
