"""Context edits on a conversation: pure functions over the request's messages.

`clear_tool_uses_20250919` replaces the oldest tool results by a placeholder (and, with
`clear_tool_inputs`, their calls' inputs by `{}`); `clear_thinking_20251015` drops the thinking
of older assistant turns. Both return new message lists; the client's own history is untouched
(it keeps sending everything, as with Anthropic). server/context_management.py decides when
they apply and measures what they cleared with the engine's own token count.

KV-friendly clearing. Every turn resends the conversation, and the prefix cache reuses a
prompt only up to its first changed token. Anthropic clears every tool use older than the last
`keep` on every request once the trigger fired, so the cleared boundary moves by one tool use
each turn and each turn re-prefills everything after it (the kept results, and all that
follows). Here the clearable uses (oldest first) are cut into *steps* of at least
`step_tokens` each, greedily from the oldest, and only whole steps are cleared. The cut
depends only on the uses themselves, so it is the same on every later turn: the cleared set
grows a whole step at a time, and between steps each turn's prompt extends the last one's and
is read from the cache. The price is at most one step's worth of old results kept beyond
`keep`. A use's size is estimated from its text (`BYTES_PER_TOKEN`), never from a count that
changes with the rest of the prompt, so the cut cannot move; what an edit clears is then
measured exactly, by counting the prompt before and after.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from mlxlaunch.protocol.context_management import (
    ClearThinkingEdit,
    ClearToolUsesEdit,
    InputTokensTrigger,
)
from mlxlaunch.protocol.requests import (
    ContentBlock,
    InputMessage,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from mlxlaunch.server.mapping import tool_result_text

# What a cleared result says instead, so the model knows something was there and is gone.
CLEARED_TOOL_RESULT = "[tool result cleared to save context]"
# Byte-level BPE tokenizers average ~4 bytes a token on code and prose; only the step cut uses
# this estimate (it must not depend on anything but the use itself).
BYTES_PER_TOKEN = 4
# Clearing less than this at once is not worth re-prefilling the rest of the prompt: a local
# re-prefill of a few thousand tokens costs seconds. A request's `clear_at_least` raises it.
DEFAULT_STEP_TOKENS = 4096


@dataclass(frozen=True)
class ToolUse:
    """One tool call of the conversation and where its result is.

    `call` and `result` are (message index, block index); `result` is None for a call whose
    result is not in the request (a prefilled assistant turn's)."""

    call: tuple[int, int]
    result: tuple[int, int] | None
    name: str
    size: int  # estimated tokens clearing it frees


def tool_uses(messages: Sequence[InputMessage], edit: ClearToolUsesEdit) -> list[ToolUse]:
    """Every tool call in `messages`, oldest first, with the estimated size of what clearing
    it under `edit` removes (its result, and its input where `edit` clears that)."""
    results: dict[str, tuple[int, int]] = {}
    for m, message in enumerate(messages):
        for b, block in enumerate(message.content):
            if isinstance(block, ToolResultBlock):
                results.setdefault(block.tool_use_id, (m, b))
    uses: list[ToolUse] = []
    for m, message in enumerate(messages):
        if message.role != "assistant":
            continue
        for b, block in enumerate(message.content):
            if not isinstance(block, ToolUseBlock):
                continue
            where = results.get(block.id)
            text = ""
            if where is not None:
                result = messages[where[0]].content[where[1]]
                assert isinstance(result, ToolResultBlock)
                text = tool_result_text(result.content)
            if edit.clears_input_of(block.name):
                text += json.dumps(block.input, ensure_ascii=False)
            uses.append(ToolUse((m, b), where, block.name, _estimated_tokens(text)))
    return uses


def _estimated_tokens(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def triggered(edit: ClearToolUsesEdit, uses: Sequence[ToolUse], input_tokens: int) -> bool:
    """Whether the prompt is past `edit`'s trigger (its tokens, or its tool uses)."""
    if isinstance(edit.trigger, InputTokensTrigger):
        return input_tokens > edit.trigger.value
    return len(uses) > edit.trigger.value


def clearable(uses: Sequence[ToolUse], edit: ClearToolUsesEdit) -> list[ToolUse]:
    """The uses `edit` may clear, oldest first: not of an excluded tool, not among the most
    recent `keep` of those."""
    eligible = [use for use in uses if not edit.excludes(use.name)]
    kept = edit.keep.value
    return eligible[: len(eligible) - kept] if kept else eligible


def whole_steps(candidates: Sequence[ToolUse], step_tokens: int) -> int:
    """How many of the oldest `candidates` to clear: those in complete steps, each step the
    shortest run (from where the last one ended) of at least `step_tokens` estimated tokens.

    The cut is prefix-stable: appending candidates never moves an earlier step's end, so a
    later turn clears a superset of what this one clears (see the module docstring)."""
    cleared = run = 0
    for position, use in enumerate(candidates):
        run += use.size
        if run >= step_tokens:
            cleared, run = position + 1, 0
    return cleared


def clear_tool_uses(
    messages: Sequence[InputMessage], edit: ClearToolUsesEdit, chosen: Sequence[ToolUse]
) -> list[InputMessage]:
    """`messages` with the `chosen` uses' results replaced by the placeholder (an error stays
    an error) and, where `edit` says so, their inputs by `{}`."""
    edits: dict[tuple[int, int], ContentBlock] = {}
    for use in chosen:
        if use.result is not None:
            result = messages[use.result[0]].content[use.result[1]]
            assert isinstance(result, ToolResultBlock)
            placeholder = [TextBlock(type="text", text=CLEARED_TOOL_RESULT)]
            edits[use.result] = result.model_copy(update={"content": placeholder})
        if edit.clears_input_of(use.name):
            call = messages[use.call[0]].content[use.call[1]]
            edits[use.call] = call.model_copy(update={"input": {}})
    return _replaced(messages, edits)


def _replaced(
    messages: Sequence[InputMessage], edits: dict[tuple[int, int], ContentBlock]
) -> list[InputMessage]:
    touched = {m for m, _ in edits}
    out: list[InputMessage] = []
    for m, message in enumerate(messages):
        if m not in touched:
            out.append(message)
            continue
        content = [edits.get((m, b), block) for b, block in enumerate(message.content)]
        out.append(message.model_copy(update={"content": content}))
    return out


def clear_thinking(
    messages: Sequence[InputMessage], edit: ClearThinkingEdit
) -> tuple[list[InputMessage], int]:
    """`messages` without the thinking of all but the last `keep` assistant turns that have
    thinking, and how many turns lost theirs. `keep: "all"` changes nothing."""
    kept = edit.kept_turns
    thinking_turns = [
        m
        for m, message in enumerate(messages)
        if message.role == "assistant" and any(_is_thinking(b) for b in message.content)
    ]
    if kept is None or len(thinking_turns) <= kept:
        return list(messages), 0
    cleared = set(thinking_turns[: len(thinking_turns) - kept])
    out = [
        message.model_copy(update={"content": [b for b in message.content if not _is_thinking(b)]})
        if m in cleared
        else message
        for m, message in enumerate(messages)
    ]
    return out, len(cleared)


def _is_thinking(block: ContentBlock) -> bool:
    return isinstance(block, ThinkingBlock | RedactedThinkingBlock)
