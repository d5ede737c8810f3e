"""Tool definitions written into the system prompt, for chat templates that ignore `tools`.

DeepSeek-V3.1's template never reads `tools`: passed the usual way, all twelve of Claude
Code's tools vanish without an error (a 4.3k-token prompt instead of 12.7k). Where the probe
finds a template that does not show the definitions it is given, they go at the end of the
system prompt instead: in the family's documented format where it has one (DeepSeek-V3.1's
model card), else as a generic section that lists each tool as JSON and shows one call written
exactly as the template itself writes an assistant's call. Tools are never dropped silently.

The section depends only on the tools (in the client's order), so it is the same on every
turn and the prefix cache keeps hitting.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

from mlxlaunch.engine.prompt.template_behaviour import EXAMPLE_CALL
from mlxlaunch.engine.types import ChatMessage, ToolSpec

SECTION_SEPARATOR = "\n\n"


def deepseek_v31_section(tools: Sequence[ToolSpec], call_example: str | None = None) -> str:
    """The tool section of DeepSeek-V3.1's model card ("Toolcall" chat template section)."""
    del call_example  # the card spells out its call format itself
    parts = ["## Tools\nYou have access to the following tools:\n"]
    for tool in tools:
        parts.append(
            f"### {tool.name}\nDescription: {tool.description}\n\n"
            f"Parameters: {_json(tool.parameters)}\n"
        )
    parts.append(
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>"
        "tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n"
        "\n"
        "Where:\n"
        "- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
        "Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces"
    )
    return "\n".join(parts)


def generic_section(tools: Sequence[ToolSpec], call_example: str | None) -> str:
    """Each tool as one line of JSON, then how a call is written: `call_example` (the
    template's own rendering of a call of `example_tool`), or plain JSON when the template
    cannot render one."""
    listed = "\n".join(
        _json({"name": t.name, "description": t.description, "parameters": t.parameters})
        for t in tools
    )
    arguments = _json(EXAMPLE_CALL.arguments)
    if call_example:
        how = (
            "To call a tool, write the call exactly in this format (here a call of a tool "
            f"named `{EXAMPLE_CALL.name}` with the arguments {arguments}):\n{call_example}"
        )
    else:
        how = (
            'To call a tool, reply with only a JSON object: {"name": <tool name>, '
            '"arguments": <arguments object>}.'
        )
    return (
        "# Tools\n\nYou may call one or more of the following tools. Each is described as a "
        "JSON object with its name, description and the JSON schema of its parameters:\n"
        f"{listed}\n\n{how}"
    )


# Families whose documentation says how to present tools in the prompt, by dialect name.
Section = Callable[[Sequence[ToolSpec], str | None], str]
DOCUMENTED_SECTIONS: dict[str, Section] = {"deepseek_v31": deepseek_v31_section}


def tool_section(
    tools: Sequence[ToolSpec], dialect_name: str | None, call_example: str | None
) -> tuple[str, str]:
    """(section text, the name of its format) for `tools`."""
    documented = DOCUMENTED_SECTIONS.get(dialect_name or "")
    if documented is not None:
        return documented(tools, call_example), f"{dialect_name} model card"
    return generic_section(tools, call_example), "generic JSON listing"


def with_tool_section(messages: list[ChatMessage], section: str) -> list[ChatMessage]:
    """`messages` with `section` at the end of the leading system prompt (a new one when
    there is none). The input is not modified."""
    if messages and messages[0].role == "system":
        first = messages[0]
        text = SECTION_SEPARATOR.join(p for p in (first.content, section) if p)
        return [dataclasses.replace(first, content=text), *messages[1:]]
    return [ChatMessage(role="system", content=section), *messages]


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)
