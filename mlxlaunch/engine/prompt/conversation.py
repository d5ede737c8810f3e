"""The conversation reshaped into what one chat template renders faithfully.

An Anthropic conversation holds shapes many real templates refuse or silently mangle: several
tool calls in one assistant turn, text after tool results in one user turn, consecutive user
turns, reasoning and text and a call in one turn, `toolu_…` ids. `adapt_conversation` rewrites
the message list for one template, as its probed `TemplateBehaviour` says, before rendering.

Every rewrite is a pure function of the messages (no clocks, no randomness, no per-call state)
and changes only the messages it must, where they stand: a later turn's history renders as
the earlier turn rendered it, so the prefix cache keeps hitting. Each rewrite has named modes;
the probe (`template_behaviour`) tries them in order on a small conversation and keeps the
first that renders every part of it, so the same functions decide and do the work.
"""

from __future__ import annotations

import dataclasses
import json

from mlxlaunch.engine.prompt.system_turns import fold_system_turns
from mlxlaunch.engine.prompt.template_modes import (
    ReasoningTextCall,
    TemplateBehaviour,
    TextAfterResults,
    TextWithCall,
)
from mlxlaunch.engine.tool_ids import IdStyle, family_tool_id
from mlxlaunch.engine.types import ChatMessage, ToolCallRecord

JOIN = "\n\n"


def adapt_conversation(
    messages: list[ChatMessage], behaviour: TemplateBehaviour
) -> list[ChatMessage]:
    """`messages` reshaped for the template `behaviour` describes (the input is not modified).

    Order matters: system turns fold first (their text may land in a user turn that later
    rules move), calls become text where the template has no tool turns, ids are mapped on
    the client's structure (the n-th call of the conversation), then calls split, texts move,
    and user turns merge."""
    out = messages if behaviour.system_turns else fold_system_turns(messages)
    if not behaviour.calls_rendered:
        out = calls_as_text(out)
    out = map_tool_ids(out, behaviour.id_style)
    if behaviour.parallel_calls == "split":
        out = split_parallel_calls(out)
    out = place_text_with_calls(out, behaviour.text_with_call, behaviour.reasoning_text_call)
    if not behaviour.consecutive_users:
        out = merge_consecutive_users(out)
    return place_text_after_results(out, behaviour.text_after_results)


def map_tool_ids(messages: list[ChatMessage], style: IdStyle) -> list[ChatMessage]:
    """Every call id (and the `tool_call_id` of its result) in the family's form.

    The index is the call's place among all calls of the conversation, so a history call
    keeps its id on every later turn. A result whose call is unknown keeps its id."""
    out: list[ChatMessage] = []
    mapped: dict[str, str] = {}  # client id -> family id, for the results that follow
    index = 0
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            calls: list[ToolCallRecord] = []
            for call in message.tool_calls:
                family = family_tool_id(call.id, style, name=call.name, index=index)
                mapped[call.id] = family
                calls.append(dataclasses.replace(call, id=family))
                index += 1
            message = dataclasses.replace(message, tool_calls=calls)
        elif message.role == "tool" and message.tool_call_id in mapped:
            message = dataclasses.replace(message, tool_call_id=mapped[message.tool_call_id])
        out.append(message)
    return out


def split_parallel_calls(messages: list[ChatMessage]) -> list[ChatMessage]:
    """An assistant turn with several calls becomes one turn per call, each followed by its
    result. The first keeps the turn's text and reasoning; results that answer none of the
    calls stay after the last one, in their order."""
    out: list[ChatMessage] = []
    position = 0
    while position < len(messages):
        message = messages[position]
        position += 1
        if message.role != "assistant" or len(message.tool_calls) < 2:
            out.append(message)
            continue
        results: list[ChatMessage] = []
        while position < len(messages) and messages[position].role == "tool":
            results.append(messages[position])
            position += 1
        for number, call in enumerate(message.tool_calls):
            if number == 0:
                out.append(dataclasses.replace(message, tool_calls=[call]))
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
            answer = next((r for r in results if r.tool_call_id == call.id), None)
            if answer is not None:
                results.remove(answer)
                out.append(answer)
        out.extend(results)
    return out


def place_text_with_calls(
    messages: list[ChatMessage],
    text_mode: TextWithCall,
    reasoning_mode: ReasoningTextCall = "as_is",
) -> list[ChatMessage]:
    """Assistant turns holding text and calls, rendered as the modes say: `reasoning_mode`
    for a turn with reasoning, then `text_mode` for one without (or whose reasoning went)."""
    out: list[ChatMessage] = []
    for message in messages:
        if message.role != "assistant" or not message.tool_calls or not message.content.strip():
            out.append(message)
            continue
        if message.reasoning:
            if reasoning_mode == "as_is":
                out.append(message)
                continue
            if reasoning_mode == "text_into_reasoning":
                reasoning = JOIN.join([message.reasoning, message.content])
                out.append(dataclasses.replace(message, content="", reasoning=reasoning))
                continue
            message = dataclasses.replace(message, reasoning=None)
        if text_mode == "split":
            out.append(ChatMessage(role="assistant", content=message.content))
            out.append(dataclasses.replace(message, content=""))
        elif text_mode == "into_reasoning":
            out.append(dataclasses.replace(message, content="", reasoning=message.content))
        else:
            out.append(message)
    return out


def calls_as_text(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Tool calls and results written as plain text, for a template that renders neither
    (one that knows only user and assistant turns): each call becomes a line of JSON in its
    assistant turn, each result a user turn that names its tool."""
    out: list[ChatMessage] = []
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            calls = [
                json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
                for c in message.tool_calls
            ]
            text = JOIN.join(t for t in (message.content, "\n".join(calls)) if t)
            out.append(dataclasses.replace(message, content=text, tool_calls=[]))
        elif message.role == "tool":
            name = message.name or "tool"
            out.append(ChatMessage(role="user", content=f"[{name} result]\n{message.content}"))
        else:
            out.append(message)
    return out


def merge_consecutive_users(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Consecutive user messages become one, their texts joined by a blank line."""
    out: list[ChatMessage] = []
    for message in messages:
        if message.role == "user" and out and out[-1].role == "user":
            text = JOIN.join(t for t in (out[-1].content, message.content) if t)
            out[-1] = dataclasses.replace(out[-1], content=text)
        else:
            out.append(message)
    return out


def place_text_after_results(
    messages: list[ChatMessage], mode: TextAfterResults
) -> list[ChatMessage]:
    """A user message right after tool results, rendered as `mode` says ("into_tool_result":
    its text joins the last result, an empty one disappears)."""
    if mode == "as_is":
        return messages
    out: list[ChatMessage] = []
    for message in messages:
        if message.role == "user" and out and out[-1].role == "tool":
            if message.content:
                result = out[-1]
                out[-1] = dataclasses.replace(
                    result, content=JOIN.join([result.content, message.content])
                )
            continue
        out.append(message)
    return out
