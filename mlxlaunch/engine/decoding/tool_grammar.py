"""Tool-call constraints: grammars that make the model emit its family's tool-call markup.

`tool_call_constraint` turns the request's tools and tool choice into a `GrammarConstraint`:

- `tool_choice` "any": the output is one or more calls (one when parallel calls are off) of
  any offered tool, each with arguments matching that tool's schema, then end of sequence;
- "tool" (with a name): the same, restricted to that tool;
- "auto" with `strict` tools: free text, optionally followed by calls; calls of strict tools
  must match their schema, other tools take any JSON object;
- "none", or "auto" without strict tools: no constraint (None).

The markup is the model family's own, generated from its record in `store/dialects.py` (the
record its streaming reader is generated from, so the output parser reads back what the
grammar lets the model write): the record's `markup` gives one call (`call_grammars`), and its
span markers, section and separator lay the calls out. Harmony's channel messages have
grammars of their own (`harmony_grammar`, chosen by the decoding plan).
Schemas are cut into pieces by the grammars, so their local `$ref`s are inlined first
(`call_grammars.argument_schema`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.call_grammars import (
    CallTool,
    constrained_tools,
    envelope_call,
    params_call,
    pythonic_call,
)
from mlxlaunch.engine.decoding.gemma_notation import gemma4_call
from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    lark_literal,
    markup_symbol,
    text_without,
    thinking_rules,
)
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec
from mlxlaunch.store.dialects import (
    DIALECTS,
    Dialect,
    JsonEnvelope,
    Notation,
    ParamElements,
    with_template_ids,
)

# The notations of their own (`store.dialects.Notation.kind`) -> their call builders.
NOTATIONS = {"gemma4": gemma4_call, "pythonic": pythonic_call}


def supported_families() -> list[str]:
    """Dialect names that tool-call constraints are available for."""
    return sorted(name for name, dialect in DIALECTS.items() if dialect.markup is not None)


def grammar_dialect(
    family: str, *, dialect: Dialect | None = None, tokenizer: TokenizerWrapper | None = None
) -> Dialect | None:
    """The record a grammar for `family` is built from: `dialect` when it is that family's,
    else the table's (None: no markup to write). A family that writes ids only where its
    template checks them (Mistral's `[CALL_ID]`) writes them when the template shows the
    marker."""
    found = dialect if dialect is not None and dialect.name == family else DIALECTS.get(family)
    if found is None or found.markup is None:
        return None
    return with_template_ids(found, getattr(tokenizer, "chat_template", None))


def call_rules(tokenizer: TokenizerWrapper, dialect: Dialect, tools: Sequence[CallTool]) -> str:
    """Lark rules defining `call`: one call in `dialect`'s markup (which must have some)."""
    markup = dialect.markup
    if isinstance(markup, ParamElements):
        return params_call(tokenizer, tools, markup)
    if isinstance(markup, JsonEnvelope):
        return envelope_call(tokenizer, tools, markup, dialect.id_style)
    assert isinstance(markup, Notation), dialect.name
    return NOTATIONS[markup.kind](tokenizer, tools)


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
    call_tools = constrained_tools(tools, choice)
    if call_tools is None:
        return None
    record = grammar_dialect(family, dialect=dialect, tokenizer=tokenizer)
    if record is None:
        raise InvalidRequest(
            f"cannot force tool calls for this model's tool-call format ({family!r}); "
            f"supported: {', '.join(supported_families())}"
        )
    forced = choice.mode in ("any", "tool")
    lines = [call_rules(tokenizer, record, call_tools)]
    prefix = ""
    if think_end is not None:
        definitions, prefix = thinking_rules(tokenizer, think_end, think=think)
        lines.append(definitions)
    lines.extend(_calls_rules(tokenizer, record, parallel=choice.parallel, forced=forced))
    lines.append(f"start: {prefix}answer")
    return GrammarConstraint.from_lark(tokenizer, "\n".join(lines) + "\n")


def _calls_rules(
    tokenizer: TokenizerWrapper, dialect: Dialect, *, parallel: bool, forced: bool
) -> list[str]:
    """Rules for `answer`: the calls (forced), or free text then optional calls. Each call has
    a span of its own (`start call end`, separated), or all share one section (`start` once,
    the calls separated, `end`); a family whose call is the whole output (`leading_call`)
    writes one, bare."""
    if dialect.leading_call is not None or not dialect.tool_call_start:
        if forced:
            return ["answer: call"]
        # Free text that does not start like a call: the reader takes a leading "{" for one.
        return ["PROSE: /(?s:.*)/ & ~/\\s*\\{(?s:.*)/", "answer: call | PROSE"]
    start = dialect.tool_call_start
    opener = markup_symbol(tokenizer, start)
    end = markup_symbol(tokenizer, dialect.tool_call_end) if dialect.tool_call_end else ""
    separator = dialect.separator
    between = f"{lark_literal(separator)}{'?' if dialect.separator_optional else ''}"
    between = between if separator else ""
    if dialect.section:
        calls = f"call ({between} call)*" if parallel else "call"
        inside = [lark_literal(t) for t in (dialect.section_open,) if t]
        closing = [lark_literal(t) for t in (dialect.section_close,) if t]
        rules = [f"after_opener: {' '.join([*inside, calls, *closing, end])}"]
    else:
        rules = [f"one_call: call {end}".rstrip()]
        rest = f"one_call ({between} {opener} one_call)*" if parallel else "one_call"
        rules.append(f"after_opener: {rest}")
    if forced:
        return [*rules, f"answer: {opener} after_opener"]
    rules.append(f"TEXT: {text_without(start)}")
    if opener.startswith("<["):  # a token ends the text lexeme
        return [*rules, f"answer: TEXT ({opener} after_opener)?"]
    # A spelled opener: text and opener must be one lazy lexeme (see call_grammars).
    rules.append(f"text_then_opener[lazy]: TEXT {opener}")
    return [*rules, "answer: TEXT | text_then_opener after_opener"]
