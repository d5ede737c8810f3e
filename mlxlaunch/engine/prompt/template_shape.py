"""Engine messages and tools in the dict shape chat templates read (the Hugging Face shape).

The one place that knows those field names. Templates disagree on where an assistant turn's
reasoning goes (`reasoning_content`, gpt-oss's `thinking`, `reasoning`, or Mistral's thinking
chunks inside `content`), so that field is a parameter, chosen by probing the template
(`template_behaviour`).
"""

from __future__ import annotations

from typing import Any, Literal

from mlxlaunch.engine.types import IMAGE_SLOT, ChatMessage, ToolSpec, split_image_slots

# Where an assistant turn's reasoning goes: a message key, or "content_blocks" (content becomes
# `[{"type": "thinking", "thinking": …}, {"type": "text", "text": …}]`).
ReasoningField = Literal["reasoning_content", "thinking", "reasoning", "content_blocks"]
REASONING_FIELDS: tuple[ReasoningField, ...] = (
    "reasoning_content",
    "thinking",
    "reasoning",
    "content_blocks",
)


def message_to_template(
    message: ChatMessage, reasoning_field: ReasoningField = "reasoning_content"
) -> dict[str, Any]:
    """One engine message as the dict chat templates expect, its reasoning under
    `reasoning_field`."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if IMAGE_SLOT in message.content:  # a vision model's images: parts the template places
        out["content"] = image_parts(message.content)
    if message.role == "assistant":
        if message.reasoning:
            if reasoning_field == "content_blocks":
                blocks: list[dict[str, str]] = [{"type": "thinking", "thinking": message.reasoning}]
                if message.content:
                    blocks.append({"type": "text", "text": message.content})
                out["content"] = blocks
            else:
                out[reasoning_field] = message.reasoning
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ]
    elif message.role == "tool":
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
    return out


def tool_to_template(tool: ToolSpec) -> dict[str, Any]:
    """One tool in the OpenAI-style function shape chat templates iterate over."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def image_parts(content: str) -> list[dict[str, str]]:
    """`content` as text and image parts, an image where each image slot stands."""
    return [
        {"type": "text", "text": part} if isinstance(part, str) else {"type": "image"}
        for part in split_image_slots(content)
    ]
