"""A request's `context_management` edits, applied before its prompt is rendered.

`manage_context` runs the request's edits in the order given (server/context_edits.py has the
edits themselves and why tool results are cleared in steps), measures each with the engine's
exact token count of the prompt before and after, and returns the edited body with the answer's
`applied_edits`. Counting costs a render and an incremental tokenization of the prompt (the
engine's renderer remembers recent prompts), and happens only where an edit needs it: an
`input_tokens` trigger, an edit that changed something, or `count_tokens`'s original count.
Claude Code's own edit on every request (`clear_thinking_20251015`, `keep: "all"`) counts nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import Generic, Protocol, TypeVar

from mlxlaunch.engine.types import GenerationRequest, PromptTooLong
from mlxlaunch.protocol.context_management import (
    AppliedEdit,
    ClearedThinking,
    ClearedToolUses,
    ClearThinkingEdit,
    ClearToolUsesEdit,
    ContextManagementResponse,
    CountTokensContextManagement,
    InputTokensTrigger,
)
from mlxlaunch.protocol.requests import CountTokensRequest, InputMessage
from mlxlaunch.server import context_edits
from mlxlaunch.server.images import ImageAccess
from mlxlaunch.server.mapping import to_generation_request

BodyT = TypeVar("BodyT", bound=CountTokensRequest)


class CountsTokens(Protocol):
    async def count_tokens(self, req: GenerationRequest) -> int: ...


@dataclass(frozen=True)
class EditedContext(Generic[BodyT]):
    """The body the model sees, and what its edits did.

    `applied` is None when the request asked for no context management (the answer then has
    no `context_management`); `original_input_tokens` is the prompt's count before any edit,
    when it was counted."""

    body: BodyT
    applied: ContextManagementResponse | None = None
    original_input_tokens: int | None = None

    def count_tokens_answer(self, edited_tokens: int) -> CountTokensContextManagement | None:
        """`count_tokens`'s `context_management`, beside `edited_tokens` (the edited count)."""
        if self.applied is None:
            return None
        original = self.original_input_tokens
        return CountTokensContextManagement(
            original_input_tokens=edited_tokens if original is None else original
        )


async def manage_context(
    body: BodyT,
    engine: CountsTokens,
    *,
    images: ImageAccess,
    count_original: bool = False,
    step_tokens: int | None = None,
) -> EditedContext[BodyT]:
    """Apply `body.context_management`'s edits.

    Args:
        body: the validated request.
        engine: counts a mapped request's prompt tokens exactly.
        images: as for `to_generation_request`.
        count_original: count the unedited prompt even if no edit needs it (count_tokens).
        step_tokens: the least a tool-result clearing removes at once (see context_edits;
            None: its DEFAULT_STEP_TOKENS); a request's `clear_at_least` raises it, and 0
            clears as Anthropic does (everything beyond `keep`, on every turn).
    """
    management = body.context_management
    if management is None:
        return EditedContext(body)
    meter = _Meter(body, engine, images)
    messages: list[InputMessage] = list(body.messages)
    if count_original:
        await meter.count(messages)
    applied: list[AppliedEdit] = []
    for edit in management.edits:
        if isinstance(edit, ClearThinkingEdit):
            edited, turns = context_edits.clear_thinking(messages, edit)
            if turns:
                freed = await meter.freed(messages, edited)
                applied.append(
                    ClearedThinking(cleared_thinking_turns=turns, cleared_input_tokens=freed)
                )
                messages = edited
        elif isinstance(edit, ClearToolUsesEdit):
            step = context_edits.DEFAULT_STEP_TOKENS if step_tokens is None else step_tokens
            result = await _clear_tool_uses(meter, messages, edit, step)
            if result is not None:
                messages, report = result
                applied.append(report)
    edited_body = body.model_copy(update={"messages": messages}) if applied else body
    answer = ContextManagementResponse(applied_edits=applied)
    # The first version counted is always the unedited one (every count starts from it).
    return EditedContext(edited_body, answer, meter.first)


async def _clear_tool_uses(
    meter: _Meter, messages: list[InputMessage], edit: ClearToolUsesEdit, step_tokens: int
) -> tuple[list[InputMessage], ClearedToolUses] | None:
    uses = context_edits.tool_uses(messages, edit)
    tokens = await meter.count(messages) if isinstance(edit.trigger, InputTokensTrigger) else 0
    if not context_edits.triggered(edit, uses, tokens):
        return None
    at_least = edit.clear_at_least.value if edit.clear_at_least is not None else 0
    candidates = context_edits.clearable(uses, edit)
    chosen = candidates[: context_edits.whole_steps(candidates, max(step_tokens, at_least))]
    if not chosen:
        return None
    edited = context_edits.clear_tool_uses(messages, edit, chosen)
    freed = await meter.freed(messages, edited)
    if freed < at_least:  # Anthropic's rule: not worth breaking the cache for less
        return None
    return edited, ClearedToolUses(cleared_tool_uses=len(chosen), cleared_input_tokens=freed)


class _Meter:
    """Exact prompt counts of versions of one request (each version counted once)."""

    def __init__(self, body: CountTokensRequest, engine: CountsTokens, images: ImageAccess):
        self._body = body
        self._engine = engine
        self._images = images
        self._counted: list[tuple[list[InputMessage], int]] = []  # a few versions at most
        self.first: int | None = None  # the count of the first version counted

    async def count(self, messages: list[InputMessage]) -> int:
        for version, tokens in self._counted:
            if version is messages:
                return tokens
        body = self._body.model_copy(update={"messages": messages})
        # Off the event loop, as every mapping is: a body of many messages takes seconds.
        request = await asyncio.to_thread(partial(to_generation_request, body, images=self._images))
        try:
            tokens = await self._engine.count_tokens(request)
        except PromptTooLong as exc:
            # Twice the window or more: counted no further, but a lower bound is enough to
            # see a trigger passed, and the edited prompt may well fit.
            tokens = exc.prompt_tokens
        self._counted.append((messages, tokens))
        if self.first is None:
            self.first = tokens
        return tokens

    async def freed(self, before: list[InputMessage], after: list[InputMessage]) -> int:
        """Tokens the edit from `before` to `after` removed from the prompt."""
        first = await self.count(before)
        return max(0, first - await self.count(after))
