"""Tool-call constraints: grammars that make the model emit its family's tool-call markup.

`tool_call_constraint` turns the request's tools and tool choice into a `GrammarConstraint`:

- `tool_choice` "any": the output is one or more calls (one when parallel calls are off) of
  any offered tool, each with arguments matching that tool's schema, then end of sequence;
- "tool" (with a name): the same, restricted to that tool;
- "auto" with `strict` tools: free text, optionally followed by calls; calls of strict tools
  must match their schema, other tools take any JSON object;
- "none", or "auto" without strict tools: no constraint (None).

The markup is the model family's own (what that family's reader downstream reads), so the
output parser sees an ordinary tool call. Families are pluggable: `CALL_GRAMMARS` maps a dialect
name to its `CallSyntax` (a builder of one call from `call_grammars`, the marker that opens
calls, what separates parallel calls, the section some families put all calls in); a family
whose whole output is shaped differently (harmony's channel messages) registers a complete
builder in `WHOLE_OUTPUT`.
Schemas are cut into pieces by the grammars, so their local `$ref`s are inlined first
(`schema_refs.inline_refs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.call_grammars import (
    ANY_OBJECT,
    DSML,
    CallGrammar,
    CallTool,
    deepseek_v31_call,
    deepseek_v32_call,
    gemma4_call,
    glm47_call,
    json_tools_call,
    kimi_k2_call,
    llama3_json_call,
    longcat_call,
    minicpm5_call,
    minimax_m2_call,
    mistral_call,
    mistral_call_with_ids,
    muse_spark_call,
    pythonic_call,
    qwen3_coder_call,
    text_without,
)
from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    lark_literal,
    markup_symbol,
    thinking_rules,
)
from mlxlaunch.engine.decoding.schema_refs import inline_refs
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec
from mlxlaunch.store.dialects import Dialect


@dataclass(frozen=True)
class Section:
    """What surrounds all of a turn's calls after the opener: `after_open`, the calls,
    `before_close`, then the `close` marker (a single-token marker becomes its token)."""

    close: str
    after_open: str = ""
    before_close: str = ""


@dataclass(frozen=True)
class CallSyntax:
    """How one family writes tool calls.

    Attributes:
        call: builder of the `call` rule. Without a `section`, every call opens with `opener`
            and `call` is the rest of it (its end marker included); with one, `opener` opens
            the section once and `call` is one whole call inside it.
        opener: the marker that starts the tool-call part of the output; free text before the
            calls may not contain it (None: the call is the whole output).
        separator: lark between two parallel calls.
        section: the markers around all the calls, for families that write one section.
        single: the format holds one call per output.
    """

    call: CallGrammar
    opener: str | None
    separator: str = ""
    section: Section | None = None
    single: bool = False


# How each dialect writes calls (the builders and their formats are in `call_grammars`).
CALL_GRAMMARS: dict[str, CallSyntax] = {
    "json_tools": CallSyntax(json_tools_call, "<tool_call>", separator='"\\n"'),
    "qwen3_coder": CallSyntax(qwen3_coder_call, "<tool_call>", separator='"\\n"'),
    "glm47": CallSyntax(glm47_call, "<tool_call>", separator='"\\n"?'),
    "longcat": CallSyntax(longcat_call, "<longcat_tool_call>", separator='"\\n"?'),
    "minicpm5": CallSyntax(minicpm5_call, '<function name="', separator='"\\n"?'),
    "mistral": CallSyntax(mistral_call, "[TOOL_CALLS]"),
    "gemma4": CallSyntax(gemma4_call, "<|tool_call>"),
    "llama3_json": CallSyntax(llama3_json_call, None, single=True),
    "kimi_k2": CallSyntax(
        kimi_k2_call,
        "<|tool_calls_section_begin|>",
        section=Section("<|tool_calls_section_end|>"),
    ),
    "deepseek_v31": CallSyntax(
        deepseek_v31_call,
        "<｜tool▁calls▁begin｜>",
        section=Section("<｜tool▁calls▁end｜>"),
    ),
    "minimax_m2": CallSyntax(
        minimax_m2_call,
        "<minimax:tool_call>",
        section=Section("</minimax:tool_call>", after_open="\n"),
    ),
    "deepseek_v32": CallSyntax(
        deepseek_v32_call,
        f"<{DSML}function_calls>",
        section=Section(f"</{DSML}function_calls>", after_open="\n"),
    ),
    "muse_spark": CallSyntax(
        muse_spark_call,
        "<atem:function_calls>",
        section=Section("</atem:function_calls>"),
    ),
    "pythonic": CallSyntax(
        pythonic_call,
        "<|tool_call_start|>",
        separator='", "',
        section=Section("<|tool_call_end|>", after_open="[", before_close="]"),
    ),
}


# A constraint builder for a family whose output is not "text, then markup" (harmony: channel
# messages). Same arguments as `tool_call_constraint` past `family`; the lead registers
# `WHOLE_OUTPUT["harmony"] = harmony_grammar.harmony_tool_constraint`.
WholeOutputConstraint = Callable[..., GrammarConstraint | None]
WHOLE_OUTPUT: dict[str, WholeOutputConstraint] = {}

# Mistral templates that check `[CALL_ID]` (Mistral Small 3.2) want the id written in the call.
_MISTRAL_WITH_IDS = CallSyntax(mistral_call_with_ids, "[TOOL_CALLS]")


def supported_families() -> list[str]:
    """Dialect names that tool-call constraints are available for."""
    return sorted({*CALL_GRAMMARS, *WHOLE_OUTPUT})


def call_syntax(
    family: str, *, dialect: Dialect | None = None, tokenizer: TokenizerWrapper | None = None
) -> CallSyntax | None:
    """How `family` writes calls (None: no grammar for it). Mistral's variant with call ids is
    chosen from the dialect (`id_style` "alnum9") or, without one, the chat template's text."""
    syntax = CALL_GRAMMARS.get(family)
    if family == "mistral" and syntax is not None:
        template = getattr(tokenizer, "chat_template", None)
        ids = dialect is not None and dialect.id_style == "alnum9"
        if ids or (isinstance(template, str) and "[CALL_ID]" in template):
            return _MISTRAL_WITH_IDS
    return syntax


def tool_call_constraint(
    tokenizer: TokenizerWrapper,
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    family: str | None = None,
    dialect: Dialect | None = None,
    think_end: str | None = None,
    think: bool = True,
) -> GrammarConstraint | None:
    """The constraint a request's tools and tool choice call for, or None when none is needed.

    Args:
        tokenizer: the loaded model's tokenizer.
        tools: the tools offered in the request.
        choice: the request's tool choice (`parallel=False`: at most one call).
        family: the model's dialect name (see `supported_families`); defaults to the name
            of `dialect`.
        dialect: the model's dialect, when known (template facts such as Mistral's call ids).
        think_end: when the rendered prompt ends inside an open think span, its closing
            marker; the model may finish thinking before the constrained part.
        think: whether it may think there first (False: the span closes at once — a prompt
            that always opens one, for a request that did not ask for thinking).

    Raises:
        InvalidRequest: the choice names a tool that is not offered, calls for a tool without
            tools, or the model's family has no tool-call grammar; or a schema cannot compile.
    """
    family = family or (dialect.name if dialect is not None else "")
    forced = choice.mode in ("any", "tool")
    if choice.mode == "none" or not (forced or any(t.strict for t in tools)):
        return None
    if not tools:
        raise InvalidRequest(f"tool_choice {choice.mode!r} needs at least one tool")
    whole = WHOLE_OUTPUT.get(family)
    if whole is not None:
        return whole(tokenizer, tools, choice, think_end=think_end)
    syntax = call_syntax(family, dialect=dialect, tokenizer=tokenizer)
    if syntax is None:
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
        CallTool(t.name, argument_schema(t.parameters), t.parameters)
        if forced or t.strict
        else CallTool(t.name, ANY_OBJECT, t.parameters)
        for t in offered
    ]
    lines = [syntax.call(tokenizer, call_tools)]
    prefix = ""
    if think_end is not None:
        definitions, prefix = thinking_rules(tokenizer, think_end, think=think)
        lines.append(definitions)
    lines.extend(_calls_rules(tokenizer, syntax, parallel=choice.parallel, forced=forced))
    lines.append(f"start: {prefix}answer")
    return GrammarConstraint.from_lark(tokenizer, "\n".join(lines) + "\n")


def _calls_rules(
    tokenizer: TokenizerWrapper, syntax: CallSyntax, *, parallel: bool, forced: bool
) -> list[str]:
    """Rules for `answer`: the calls (forced), or free text then optional calls."""
    many = parallel and not syntax.single
    if syntax.opener is None:  # the call is the whole output (Llama 3's bare JSON)
        if forced:
            return ["answer: call"]
        # Free text that does not start like a call: the reader takes a leading "{" for one.
        return ["PROSE: /(?s:.*)/ & ~/\\s*\\{(?s:.*)/", "answer: call | PROSE"]
    opener = markup_symbol(tokenizer, syntax.opener)
    section = syntax.section
    if section is None:
        rest = f"call ({syntax.separator} {opener} call)*" if many else "call"
    else:
        calls = f"call ({syntax.separator} call)*" if many else "call"
        before = lark_literal(section.after_open) if section.after_open else ""
        after = lark_literal(section.before_close) if section.before_close else ""
        rest = f"{before} {calls} {after} {markup_symbol(tokenizer, section.close)}"
    rules = [f"after_opener: {rest}"]
    if forced:
        return [*rules, f"answer: {opener} after_opener"]
    rules.append(f"TEXT: {text_without(syntax.opener)}")
    if opener.startswith("<["):  # a token ends the text lexeme
        return [*rules, f"answer: TEXT ({opener} after_opener)?"]
    # A spelled opener: text and opener must be one lazy lexeme (see call_grammars).
    rules.append(f"text_then_opener[lazy]: TEXT {opener}")
    return [*rules, "answer: TEXT | text_then_opener after_opener"]


def argument_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as a grammar takes it: an object, whatever the client sent, with
    its local `$ref`s inlined."""
    if not isinstance(schema, dict) or not schema:
        return ANY_OBJECT
    cleaned = {k: v for k, v in schema.items() if k != "$schema"}
    cleaned.setdefault("type", "object")
    return inline_refs(cleaned)
