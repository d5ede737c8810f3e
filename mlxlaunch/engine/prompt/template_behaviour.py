"""What one chat template does with each shape of conversation, learned by rendering probes.

Each question (which field it reads reasoning from, whether it renders two calls of one turn,
a user turn right after tool results, consecutive user turns, `toolu_…` ids, tool definitions…)
is answered by rendering a tiny conversation whose parts carry marks and checking that every
mark comes out, in order. A template that raises, or drops or moves a mark, "does not render"
that shape; the answer is then the first rewrite (`conversation`) under which it does.

Nothing here names a model family: a template we have never seen is probed the same way. The
one outside fact is the dialect's id style (Kimi's parser reads `functions.Name:N` ids, which
no template check reveals). Probes are cheap (tens of renders, once per tokenizer) and run
where the caller holds the tokenizer lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from mlxlaunch.engine.prompt.conversation import (
    place_text_after_results,
    place_text_with_calls,
    split_parallel_calls,
)
from mlxlaunch.engine.prompt.system_turns import renders_system_turns
from mlxlaunch.engine.prompt.template_modes import (
    ParallelCalls,
    ReasoningTextCall,
    TemplateBehaviour,
    TextAfterResults,
    TextWithCall,
)
from mlxlaunch.engine.prompt.template_shape import (
    REASONING_FIELDS,
    ReasoningField,
    message_to_template,
    tool_to_template,
)
from mlxlaunch.engine.tool_ids import IdStyle, family_tool_id
from mlxlaunch.engine.types import ChatMessage, ToolCallRecord, ToolSpec

# (messages, tools or None, add_generation_prompt) -> prompt text; raises when the template does.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]

PROBE_TOOL = ToolSpec(
    name="mlxprobe_tool",
    description="mlxprobeToolDescription",
    parameters={
        "type": "object",
        "properties": {"x": {"type": "string", "description": "a value"}},
        "required": ["x"],
    },
)
# The call shown as an example in tool sections written for templates that ignore tools.
EXAMPLE_CALL = ToolCallRecord(id="", name="example_tool", arguments={"argument": "value"})
# Id forms tried, in order, after the dialect's own (or when it asks for none).
_ID_STYLES: tuple[IdStyle, ...] = ("any", "alnum9", "functions_index")
# A reasoning mark that shows up next to these was printed as a Python or JSON dict (a
# template that stringifies a content list), not rendered.
_BLOCK_REPRS = ("'thinking'", '"thinking"', "'type'")


def probe_template(render: Render, id_style: IdStyle = "any") -> TemplateBehaviour:
    """Probe the template behind `render` once. `id_style` is the dialect's ("any": none
    asked for)."""
    empty_tools = needs_tool_list(render)
    if empty_tools:  # every probe below renders as the prompts will: with a list
        render = partial(_with_tool_list, render)
    prober = _Prober(render)
    prober.tools_accepted = prober.accepts_tools()
    ids, ids_rendered, calls_rendered = prober.id_form(id_style)
    prober.id_style = ids
    field, shown = prober.find_reasoning_field()
    prober.reasoning_field = field
    tools_rendered = prober.tools_accepted and prober.renders_tools()
    turns = TemplateBehaviour(
        empty_tools=empty_tools,
        tools_accepted=prober.tools_accepted,
        calls_rendered=calls_rendered,
        reasoning_field=field,
        reasoning_shown=shown,
        system_turns=renders_system_turns(lambda messages: render(messages, None, True)),
        consecutive_users=prober.renders_consecutive_users(),
        tools_rendered=tools_rendered,
    )
    if not calls_rendered:  # calls go in as text: no call shape needs a rewrite
        return turns
    return dataclasses.replace(
        turns,
        id_style=ids,
        ids_rendered=ids_rendered,
        parallel_calls=prober.parallel_calls(),
        text_with_call=prober.text_with_call(shown),
        # Where no reasoning shows, a turn with reasoning is rendered as one without.
        reasoning_text_call=prober.reasoning_text_call() if shown else "drop_reasoning",
        text_after_results=prober.text_after_results(),
        call_example=None if tools_rendered else prober.call_example(),
    )


def needs_tool_list(render: Render) -> bool:
    """Whether the template fails on a conversation without tools (tools=None) and renders
    it given an empty list."""
    opening = [message_to_template(m, "reasoning_content") for m in _Prober.opening()]
    try:
        render(opening, None, True)
        return False
    except Exception:  # a template that refuses the shape: any exception it raises
        pass
    try:
        render(opening, [], True)
        return True
    except Exception:
        return False


def _with_tool_list(
    render: Render, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
) -> str:
    return render(messages, [] if tools is None else tools, gen)


def in_order(text: str, marks: Sequence[str]) -> bool:
    """Whether every mark occurs in `text`, each after the one before it."""
    at = 0
    for mark in marks:
        found = text.find(mark, at)
        if found < 0:
            return False
        at = found + len(mark)
    return True


def _m(name: str) -> str:
    return f"mlxprobe{name}"


SYSTEM, USER, ANSWER, LATER = _m("System"), _m("UserOne"), _m("Answer"), _m("UserTwo")


class _Prober:
    """Renders probe conversations: a system prompt, a user turn, the shape under test, and
    (for shapes whose trouble shows later, like Mistral's alternation checks) a final answer
    and a next user turn."""

    def __init__(self, render: Render) -> None:
        self._render = render
        self.id_style: IdStyle = "any"
        self.reasoning_field: ReasoningField = "reasoning_content"
        self.tools_accepted = True  # False: probes offer no tools (the template fails then)

    # --- rendering --------------------------------------------------------------------------

    def text(
        self,
        messages: list[ChatMessage],
        *,
        tools: bool = True,
        generation_prompt: bool = True,
        field: ReasoningField | None = None,
    ) -> str | None:
        """The rendered text, or None when the template raises."""
        shaped = [message_to_template(m, field or self.reasoning_field) for m in messages]
        offered = [tool_to_template(PROBE_TOOL)] if tools and self.tools_accepted else None
        try:
            return str(self._render(shaped, offered, generation_prompt))
        except Exception:  # a template that refuses the shape: any exception it raises
            return None

    def shows(self, messages: list[ChatMessage], *chains: Sequence[str], **kwargs: Any) -> bool:
        """Whether `messages` render with every chain of marks in order."""
        text = self.text(messages, **kwargs)
        return text is not None and all(in_order(text, chain) for chain in chains)

    def call(self, number: int) -> ToolCallRecord:
        """The probe's `number`-th call (0-based), its id in the current id style."""
        client_id = f"toolu_01mlxprobe{number}AbCdEfGhIjKlMn"
        name = PROBE_TOOL.name
        return ToolCallRecord(
            id=family_tool_id(client_id, self.id_style, name=name, index=number),
            name=name,
            arguments={"x": _m(f"Argument{number}")},
        )

    def result(self, call: ToolCallRecord, number: int) -> ChatMessage:
        return ChatMessage(
            role="tool", content=_m(f"Result{number}"), tool_call_id=call.id, name=call.name
        )

    @staticmethod
    def opening() -> list[ChatMessage]:
        return [ChatMessage("system", SYSTEM), ChatMessage("user", USER)]

    @staticmethod
    def closing() -> list[ChatMessage]:
        return [ChatMessage("assistant", ANSWER), ChatMessage("user", LATER)]

    # --- the questions -----------------------------------------------------------------------

    def id_form(self, asked: IdStyle) -> tuple[IdStyle, bool, bool]:
        """(the id style to render, whether ids appear in the prompt, whether calls render
        at all). The dialect's style first (its parser reads it); with none asked, or one
        the template refuses, `toolu_…` ids if the template takes them, else the first form
        it takes: a prompt that renders beats ids the parser prefers."""
        candidates = [asked, *(s for s in _ID_STYLES if s != asked)]
        for style in candidates:
            self.id_style = style
            call = self.call(0)
            text = self.text(
                [
                    *self.opening(),
                    ChatMessage("assistant", "", tool_calls=[call]),
                    self.result(call, 0),
                ]
            )
            if text is not None and in_order(text, [_m("Argument0"), _m("Result0")]):
                return style, call.id in text, True
        return asked, False, False

    def find_reasoning_field(self) -> tuple[ReasoningField, bool]:
        """The first field whose reasoning the template shows, in a call turn (Gemma shows it
        only there) or in a final text turn (some show it only there); "reasoning_content"
        when none shows (then it is ignored wherever it goes)."""
        mark = _m("Reasoning")
        call = self.call(0)
        contexts = [
            [
                *self.opening(),
                ChatMessage("assistant", "", reasoning=mark, tool_calls=[call]),
                self.result(call, 0),
            ],
            [*self.opening(), ChatMessage("assistant", ANSWER, reasoning=mark)],
        ]
        for field in REASONING_FIELDS:
            for messages in contexts:
                text = self.text(messages, field=field)
                if text is None or mark not in text:
                    continue
                if field == "content_blocks" and any(r in text for r in _BLOCK_REPRS):
                    continue
                return field, True
        return "reasoning_content", False

    def accepts_tools(self) -> bool:
        """False when the opening renders without tools and fails with them."""
        opening = self.opening()
        return self.text(opening) is not None or self.text(opening, tools=False) is None

    def renders_tools(self) -> bool:
        """Whether tool definitions given to the template show up (its description does)."""
        text = self.text(self.opening())
        return text is not None and PROBE_TOOL.description in text

    def renders_consecutive_users(self) -> bool:
        second = _m("UserAgain")
        messages = [*self.opening(), ChatMessage("user", second), *self.closing()]
        return self.shows(messages, [USER, second, ANSWER, LATER])

    def parallel_calls(self) -> ParallelCalls:
        first, second = self.call(0), self.call(1)
        messages = [
            *self.opening(),
            ChatMessage("assistant", "", tool_calls=[first, second]),
            self.result(first, 0),
            self.result(second, 1),
            *self.closing(),
        ]
        calls = [_m("Argument0"), _m("Argument1")]
        results = [_m("Result0"), _m("Result1"), ANSWER, LATER]
        if self.shows(messages, calls, results, [calls[1], results[1]]):
            return "as_is"
        split = [_m("Argument0"), _m("Result0"), _m("Argument1"), _m("Result1"), ANSWER, LATER]
        return "split" if self.shows(split_parallel_calls(messages), split) else "as_is"

    def text_with_call(self, reasoning_shown: bool) -> TextWithCall:
        """How a turn with text and a call renders both: as it is, split in two turns, or
        with the text as its reasoning (only where the template shows reasoning)."""
        text, call = _m("Text"), self.call(0)
        turn = [
            *self.opening(),
            ChatMessage("assistant", text, tool_calls=[call]),
            self.result(call, 0),
        ]
        modes: list[TextWithCall] = ["as_is", "split"]
        if reasoning_shown:
            modes.append("into_reasoning")
        for mode in modes:
            if self.keeps(partial(place_text_with_calls, text_mode=mode), turn, [text]):
                return mode
        return "dropped"

    def reasoning_text_call(self) -> ReasoningTextCall:
        """How a turn with reasoning, text and a call renders all three."""
        reasoning, text, call = _m("Reasoning"), _m("Text"), self.call(0)
        turn = [
            *self.opening(),
            ChatMessage("assistant", text, reasoning=reasoning, tool_calls=[call]),
            self.result(call, 0),
        ]
        modes: tuple[ReasoningTextCall, ...] = ("as_is", "text_into_reasoning")
        for mode in modes:
            rewrite = partial(place_text_with_calls, text_mode="as_is", reasoning_mode=mode)
            if self.keeps(rewrite, turn, [reasoning, text]):
                return mode
        # Neither keeps both: keep the text and the call, lose the reasoning.
        return "drop_reasoning"

    def keeps(
        self,
        rewrite: Callable[[list[ChatMessage]], list[ChatMessage]],
        turn: list[ChatMessage],
        marks: Sequence[str],
    ) -> bool:
        """Whether `rewrite` of a conversation ending in a call turn and its result (`turn`)
        shows every mark of that turn and its call, and still renders the turns after it.

        Marks are looked for while the call turn is the latest: templates drop a call turn's
        reasoning (gpt-oss: its analysis text too) once a final answer follows, by design."""
        call = [_m("Argument0"), _m("Result0")]
        latest = self.shows(rewrite(turn), call, *([USER, mark] for mark in marks))
        later = [*turn, *self.closing()]
        return latest and self.shows(rewrite(later), [*call, ANSWER, LATER])

    def text_after_results(self) -> TextAfterResults:
        text, call = _m("TextAfterResult"), self.call(0)
        messages = [
            *self.opening(),
            ChatMessage("assistant", "", tool_calls=[call]),
            self.result(call, 0),
            ChatMessage("user", text),
            *self.closing(),
        ]
        chain = [_m("Argument0"), _m("Result0"), text, ANSWER, LATER]
        modes: tuple[TextAfterResults, ...] = ("as_is", "into_tool_result")
        for mode in modes:
            if self.shows(place_text_after_results(messages, mode), chain):
                return mode
        return "as_is"

    def call_example(self) -> str | None:
        """What the template adds for an assistant turn holding `EXAMPLE_CALL`: the turn as
        the model would write it (after the text the generation prompt and the turn share)."""
        call = dataclasses.replace(
            EXAMPLE_CALL,
            id=family_tool_id(
                "toolu_01mlxprobeExample", self.id_style, name=EXAMPLE_CALL.name, index=0
            ),
        )
        opening = self.opening()
        before = self.text(opening, tools=False)
        after = self.text(
            [*opening, ChatMessage("assistant", "", tool_calls=[call])],
            tools=False,
            generation_prompt=False,
        )
        if before is None or after is None:
            return None
        shared = 0
        while shared < min(len(before), len(after)) and before[shared] == after[shared]:
            shared += 1
        # Back to the end of a line or of markup, so no marker is cut in two ("<|" shared by
        # a generation prompt's "<|channel>" and the call's "<|tool_call>").
        while shared > 0 and after[shared - 1] not in "\n>]":
            shared -= 1
        example = after[shared:].strip()
        return example if EXAMPLE_CALL.name in example else None
