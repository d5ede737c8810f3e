"""One conversation, three shapes: Anthropic Messages, OpenAI chat completions, chat template.

The benchmark compares servers on the same conversation, so these translations must carry the
same system text, tools and messages; the tests check that they do.
"""

from __future__ import annotations

import json
from typing import Any

from mlxlaunch.bench.workloads import Conversation
from mlxlaunch.engine.types import ChatMessage, ToolSpec
from mlxlaunch.server.blocks import thinking_signature

BENCH_MODEL = "mlx-bench"
# mlx_lm.server loads whatever model a request names; this name means "the one it started with".
PEER_MODEL = "default_model"
# Claude Code sends no temperature, so servers sample at 1.0; greedy decoding of a random-weight
# test model also tends to repeat whitespace, which servers may hold back as no content at all.
TEMPERATURE = 1.0
# mlx_lm.server hands messages to the chat template as they come; an assistant's thinking goes
# where Qwen3's template reads it (GLM's, MiniMax's and Gemma 4's too; gpt-oss reads `thinking`).
REASONING_FIELD = "reasoning_content"


def temperature_of(conversation: Conversation) -> float:
    """The temperature a request of `conversation` asks for."""
    return TEMPERATURE if conversation.temperature is None else conversation.temperature


def anthropic_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages in Anthropic form: reasoning becomes a `thinking` block, tool calls become
    `tool_use` blocks, tool messages become `tool_result` blocks of one user turn (consecutive
    results merge, as Claude Code sends them)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
            }
            last = out[-1] if out else None
            if (
                last
                and last["role"] == "user"
                and isinstance(last["content"], list)
                and all(b.get("type") == "tool_result" for b in last["content"])
            ):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif message.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.reasoning:
                # Signed as our server signs it: what Claude Code would echo back.
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": message.reasoning,
                        "signature": thinking_signature(message.reasoning),
                    }
                )
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in message.tool_calls
            ]
            out.append({"role": "assistant", "content": blocks})
        elif message.role == "user":
            out.append({"role": "user", "content": message.content})
        else:
            raise ValueError(f"role {message.role!r} has no place in a benchmark conversation")
    return out


def anthropic_body(conversation: Conversation, *, max_tokens: int) -> dict[str, Any]:
    """A streaming `POST /v1/messages` body; thinking as Claude Code asks for it when the
    conversation wants it (adaptive, but shown: the first thinking delta is the first token)."""
    body: dict[str, Any] = {
        "model": conversation.model or BENCH_MODEL,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": temperature_of(conversation),
        "system": conversation.system,
        "messages": anthropic_messages(conversation.messages),
    }
    if conversation.thinking:
        body["thinking"] = {"type": "adaptive"}
    if conversation.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in conversation.tools
        ]
    return body


def openai_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """Tools in OpenAI function format (also what chat templates take)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _openai_message(message: ChatMessage, *, arguments_as_json: bool) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning:
        out[REASONING_FIELD] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": json.dumps(c.arguments) if arguments_as_json else c.arguments,
                },
            }
            for c in message.tool_calls
        ]
    return out


def openai_messages(
    conversation: Conversation, *, arguments_as_json: bool = True
) -> list[dict[str, Any]]:
    """System plus messages in OpenAI chat form. Tool-call arguments are JSON strings on the
    wire; chat templates want them as dicts (`arguments_as_json=False`)."""
    return [{"role": "system", "content": conversation.system}] + [
        _openai_message(m, arguments_as_json=arguments_as_json) for m in conversation.messages
    ]


def openai_body(
    conversation: Conversation, *, max_tokens: int, model: str = PEER_MODEL
) -> dict[str, Any]:
    """A streaming `POST /v1/chat/completions` body for mlx_lm.server, asking for usage
    (prompt and cached token counts) in the last chunk; thinking as the conversation wants.
    The conversation's model id is not sent: mlx_lm.server would load whatever model a request
    names, and it serves every tier on its one model, as peers do."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": temperature_of(conversation),
        "messages": openai_messages(conversation),
        # Rendered as our server renders with thinking on or off.
        "chat_template_kwargs": {"enable_thinking": conversation.thinking},
    }
    if conversation.tools:
        body["tools"] = openai_tools(conversation.tools)
    return body
