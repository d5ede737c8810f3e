"""What a chat template renders faithfully, and the rewrite chosen for the rest: the record
`template_behaviour` fills by probing and `conversation` reads to reshape the messages.

A leaf of the prompt sub-room, so the probe and the rewrites both import it and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlxlaunch.engine.prompt.template_shape import ReasoningField
from mlxlaunch.engine.tool_ids import IdStyle

# Several calls in one assistant turn: "as_is", or "split" into one call per assistant turn,
# each followed by its own result (the shape of harmony's and Llama 3's own multi-call turns).
ParallelCalls = Literal["as_is", "split"]
# Text before a call in one assistant turn (no reasoning): "as_is"; "split" into a text turn
# and a call turn; "into_reasoning" (the text becomes the turn's reasoning); "dropped" (nothing
# renders it: left as is, the template drops the text).
TextWithCall = Literal["as_is", "split", "into_reasoning", "dropped"]
# Reasoning, text and a call in one turn: "as_is"; "text_into_reasoning" (gpt-oss refuses both
# `content` and `thinking` beside a call: the text joins the reasoning); "drop_reasoning" (the
# turn is then rendered as text with a call; also where the template shows no reasoning).
ReasoningTextCall = Literal["as_is", "text_into_reasoning", "drop_reasoning"]
# A user turn that carries tool results and then text: "as_is" (tool messages, then a user
# message) or "into_tool_result" (the text joins the last result: Mistral templates refuse a
# user message right after tool results).
TextAfterResults = Literal["as_is", "into_tool_result"]


@dataclass(frozen=True)
class TemplateBehaviour:
    """What a chat template renders faithfully, and the rewrite chosen for what it does not.

    Attributes:
        calls_rendered: the template renders tool calls and results (else they go in as
            text, `conversation.calls_as_text`).
        id_style: the tool-call id form rendered (the dialect's, or the first form the
            template accepts when the dialect has none).
        ids_rendered: the template writes call ids into the prompt at all.
        reasoning_field: where an assistant turn's reasoning goes.
        reasoning_shown: the template shows reasoning from that field (in some turn).
        system_turns: a system turn after a user turn renders in place.
        consecutive_users: two user turns in a row both render.
        parallel_calls: how a turn with several calls is rendered.
        text_with_call: how a turn with text and a call (no reasoning) is rendered.
        reasoning_text_call: how a turn with reasoning, text and a call is rendered.
        text_after_results: how a user message right after tool results is rendered.
        tools_rendered: the template shows the tool definitions it is given.
        call_example: how the template writes `EXAMPLE_CALL` in an assistant turn (None: not
            probed, or it cannot); for tool sections of templates that ignore tools.
        empty_tools: the template fails without a tool list (it iterates `tools`, takes its
            length): a request without tools gives it an empty list.
        tools_accepted: False when the template fails whenever it is given tools (written
            for a model without tool use): it gets none, and the tool definitions go into the
            system prompt as for a template that ignores them.
    """

    calls_rendered: bool = True
    id_style: IdStyle = "any"
    ids_rendered: bool = False
    reasoning_field: ReasoningField = "reasoning_content"
    reasoning_shown: bool = True
    system_turns: bool = True
    consecutive_users: bool = True
    parallel_calls: ParallelCalls = "as_is"
    text_with_call: TextWithCall = "as_is"
    reasoning_text_call: ReasoningTextCall = "as_is"
    text_after_results: TextAfterResults = "as_is"
    tools_rendered: bool = True
    call_example: str | None = None
    empty_tools: bool = False
    tools_accepted: bool = True


# The template's behaviour when nothing is known: render everything as it comes.
FAITHFUL = TemplateBehaviour()
