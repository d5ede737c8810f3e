"""Tool-call constraints: grammars that make the model emit its family's tool-call markup.

`tool_call_constraint` turns the request's tools and tool choice into a `GrammarConstraint`:

- `tool_choice` "any": the output is one or more calls (one when parallel calls are off) of
  any offered tool, each with arguments matching that tool's schema, then end of sequence;
- "tool" (with a name): the same, restricted to that tool;
- "auto" with `strict` tools: free text, optionally followed by calls; calls of strict tools
  must match their schema, other tools take any JSON object;
- "none", or "auto" without strict tools: no constraint (None).

The markup is the model family's own (what mlx-lm's tool parser of that name reads), so the
output parser downstream sees an ordinary tool call. Families are pluggable: `CALL_GRAMMARS`
maps an mlx-lm tool-parser name to a builder of the lark rule for one call.
Covered: `json_tools` (Qwen2.5/Qwen3/Hermes: `<tool_call>\\n{"name": …, "arguments": …}\\n
</tool_call>`) and `qwen3_coder` (`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n
</parameter>\\n</function>\\n</tool_call>`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    json_rule,
    lark_literal,
    markup_symbol,
    text_without,
    thinking_rules,
)
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class CallTool:
    """One tool as a grammar sees it: its name and the schema its arguments must match."""

    name: str
    schema: dict[str, Any]


# A builder returns lark rules whose `call` rule is one complete tool call in the family's
# markup (start and end markers included), for a call of any of `tools`.
CallGrammar = Callable[[TokenizerWrapper, Sequence[CallTool]], str]


def json_tools_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>` (Qwen, Hermes)."""
    start = markup_symbol(tokenizer, "<tool_call>")
    end = markup_symbol(tokenizer, "</tool_call>")
    bodies = []
    for tool in tools:
        bodies.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": tool.schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    # One %json with anyOf: llguidance picks the branch from the name, so no ambiguity.
    body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
    return f'call: {start} "\\n" call_body "\\n" {end}\ncall_body: {json_rule(body)}\n'


def qwen3_coder_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>
    \\n</tool_call>` (Qwen3-Coder). String values are raw text, other values JSON; required
    parameters come first, in schema order, then any optional ones in schema order."""
    start = markup_symbol(tokenizer, "<tool_call>")
    end = markup_symbol(tokenizer, "</tool_call>")
    rules = [f'call: {start} "\\n" ({" | ".join(f"fn_{i}" for i in range(len(tools)))}) {end}']
    for i, tool in enumerate(tools):
        props: dict[str, Any] = tool.schema.get("properties") or {}
        required = [p for p in tool.schema.get("required", []) if p in props]
        optional = [p for p in props if p not in required]
        params = []
        for j, name in enumerate(required + optional):
            rule = f"p_{i}_{j}"
            value = props[name] if isinstance(props[name], dict) else {}
            if _is_raw_string(value):
                body = _raw_string(value, f"P_{i}_{j}", rules)
            else:
                body = json_rule(value)
            header = lark_literal(f"<parameter={name}>\n")
            rules.append(f'{rule}: {header} {body} "\\n</parameter>\\n"')
            params.append(rule if name in required else f"{rule}?")
        head = lark_literal(f"<function={tool.name}>\n")
        rules.append(f'fn_{i}: {head} {" ".join(params)} "</function>\\n"')
    return "\n".join(rules) + "\n"


def _is_raw_string(schema: dict[str, Any]) -> bool:
    """Whether mlx-lm's qwen3_coder parser keeps this parameter's text as is: string types,
    and untyped enums of strings (it JSON-decodes only objects and arrays there)."""
    if "type" in schema:
        return str(schema["type"]).lower() in ("string", "str", "text", "enum")
    enum = schema.get("enum")
    return isinstance(enum, list) and bool(enum) and all(isinstance(v, str) for v in enum)


def _raw_string(schema: dict[str, Any], terminal: str, rules: list[str]) -> str:
    """A string parameter as Qwen3-Coder writes it: raw text, not JSON. Enums become
    alternatives; otherwise any text without the closing tag, within `maxLength`."""
    enum = [v for v in schema.get("enum", []) if isinstance(v, str)]
    if enum:
        return "(" + " | ".join(lark_literal(v) for v in enum) + ")"
    limit = schema.get("maxLength")
    length = f"{{0,{int(limit)}}}" if isinstance(limit, int) else "*"
    rules.append(f"{terminal}: /(?s:.{length})/ & {text_without(chr(10) + '</parameter>')}")
    return terminal


CALL_GRAMMARS: dict[str, CallGrammar] = {
    "json_tools": json_tools_call,
    "qwen3_coder": qwen3_coder_call,
}

# What separates two calls, and the marker that opens a call (kept out of free text).
_CALL_SEPARATOR = {"json_tools": '"\\n"', "qwen3_coder": '"\\n"'}
_CALL_START = {"json_tools": "<tool_call>", "qwen3_coder": "<tool_call>"}


def supported_families() -> list[str]:
    """mlx-lm tool-parser names that tool-call constraints are available for."""
    return sorted(CALL_GRAMMARS)


def tool_call_constraint(
    tokenizer: TokenizerWrapper,
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    family: str,
    think_end: str | None = None,
) -> GrammarConstraint | None:
    """The constraint a request's tools and tool choice call for, or None when none is needed.

    Args:
        tokenizer: the loaded model's tokenizer.
        tools: the tools offered in the request.
        choice: the request's tool choice (`parallel=False`: at most one call).
        family: the model's mlx-lm tool-parser name (see `supported_families`).
        think_end: when the rendered prompt ends inside an open think span, its closing
            marker; the model may finish thinking before the constrained part.

    Raises:
        InvalidRequest: the choice names a tool that is not offered, calls for a tool without
            tools, or the model's family has no tool-call grammar; or a schema cannot compile.
    """
    forced = choice.mode in ("any", "tool")
    if choice.mode == "none" or not (forced or any(t.strict for t in tools)):
        return None
    if not tools:
        raise InvalidRequest(f"tool_choice {choice.mode!r} needs at least one tool")
    builder = CALL_GRAMMARS.get(family)
    if builder is None:
        raise InvalidRequest(
            f"cannot force tool calls for this model's tool-call format ({family!r}); "
            f"supported: {', '.join(supported_families())}"
        )
    offered = list(tools)
    if choice.mode == "tool":
        offered = [t for t in tools if t.name == choice.name]
        if not offered:
            raise InvalidRequest(f"tool_choice names tool {choice.name!r}, which is not offered")
    call_tools = [
        CallTool(t.name, _argument_schema(t.parameters) if forced or t.strict else ANY_OBJECT)
        for t in offered
    ]
    calls = "call" if not choice.parallel else f"call ({_CALL_SEPARATOR[family]} call)*"
    lines = [builder(tokenizer, call_tools), f"calls: {calls}"]
    prefix = ""
    if think_end is not None:
        definitions, prefix = thinking_rules(tokenizer, think_end)
        lines.append(definitions)
    if forced:
        lines.append(f"start: {prefix}calls")
    else:
        lines.append(f"TEXT: {text_without(_CALL_START[family])}")
        lines.append(f"start: {prefix}TEXT calls?")
    return GrammarConstraint.from_lark(tokenizer, "\n".join(lines) + "\n")


def _argument_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as a grammar takes it: an object, whatever the client sent."""
    if not isinstance(schema, dict) or not schema:
        return ANY_OBJECT
    cleaned = {k: v for k, v in schema.items() if k != "$schema"}
    cleaned.setdefault("type", "object")
    return cleaned
