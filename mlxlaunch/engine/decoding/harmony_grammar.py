"""Tool-call constraints for harmony (gpt-oss): grammars over its channel messages.

`harmony_tool_constraint` is `tool_call_constraint` for gpt-oss. Harmony has no call markup
inside free text: the prompt ends with `<|start|>assistant` and the output is messages, so the
grammar is over messages, never over "text, then markup":

- `tool_choice` any / tool: an optional analysis message, then one call
      <|channel|>analysis<|message|>…<|end|><|start|>assistant
      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
  (or the recipient-first header the template renders history with, ` to=functions.NAME
  <|channel|>commentary json`), the arguments matching the tool's schema;
- "auto" with `strict` tools: an optional analysis, then a final answer or an optional preamble
  and a call; strict tools' arguments match their schema, other tools take any object;
- "none", or "auto" without strict tools: no constraint (None).

`harmony_schema_constraint` is the response-schema counterpart: the JSON is a final message.

A harmony turn holds one call: `<|call|>` is an end-of-sequence token, so parallel calls are one
per generation whatever `choice.parallel` says. The grammar spells `<|call|>` itself, so a call
ends the way the template renders it in history (not with `<|return|>`), even with a tokenizer
that does not list `<|call|>` as end of sequence. Free text (analysis, preamble, final)
may not contain `<|`: spelled in bytes, a marker would still read as markup downstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.call_grammars import constrained_tools
from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    json_rule,
    lark_literal,
    markup_symbol,
    text_without,
)
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec


class NamedSchema(Protocol):
    """A tool as a grammar sees it (`tool_grammar.CallTool` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> dict[str, Any]: ...


def harmony_call(tokenizer: TokenizerWrapper, tools: Sequence[NamedSchema]) -> str:
    """Lark rules whose `call` rule is one harmony call message of any of `tools`, from its
    header (after the prompt's `<|start|>assistant`) to `<|call|>` — the shape of the call rules
    `call_grammars` builds."""
    sym = _Symbols(tokenizer)
    rules = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        recipient = "to=functions." + tool.name
        channel_first = (
            f'{sym.channel} {lark_literal("commentary " + recipient + " ")} {sym.constrain} "json"'
        )
        recipient_first = f'{lark_literal(" " + recipient)} {sym.channel} "commentary json"'
        rules.append(f"call_{i}: (head_{i}_a | head_{i}_b) {sym.message} args_{i} {sym.call}")
        rules.append(f"head_{i}_a: {channel_first}")
        rules.append(f"head_{i}_b: {recipient_first}")
        rules.append(f"args_{i}: {json_rule(tool.schema)}")
    return "\n".join(rules) + "\n"


def harmony_tool_constraint(
    tokenizer: TokenizerWrapper,
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    think_end: str | None = None,
    analysis: bool = True,
) -> GrammarConstraint | None:
    """The constraint a request's tools and tool choice call for on gpt-oss, or None: the
    arguments and errors of `tool_grammar.tool_call_constraint`, except that `think_end` is
    unused (harmony prompts open no think span; the analysis message is the thinking) and
    `analysis` allows an analysis message before the constrained part (gpt-oss reasons first
    by training; without it the output starts at the call or answer)."""
    del think_end
    # Each schema stays whole here (one %json per call), so its `$ref`s need no inlining.
    call_tools = constrained_tools(tools, choice, inline=False)
    if call_tools is None:
        return None
    forced = choice.mode in ("any", "tool")
    sym = _Symbols(tokenizer)
    lines = [harmony_call(tokenizer, call_tools), _free_text(sym)]
    lead = "analysis? " if analysis else ""
    if forced:
        lines.append(f"start: {lead}call")
    else:
        lines.append(f'preamble: {sym.channel} "commentary" {sym.message} TEXT {sym.next}')
        lines.append(f'final: {sym.channel} "final" {sym.message} TEXT')
        lines.append(f"start: {lead}(final | preamble? call)")
    return GrammarConstraint.from_lark(tokenizer, "\n".join(lines) + "\n")


def harmony_schema_constraint(
    tokenizer: TokenizerWrapper, schema: dict[str, Any], *, analysis: bool = True
) -> GrammarConstraint:
    """A response schema on gpt-oss: an optional analysis, then a final message whose text is
    one JSON value matching `schema` (`JsonConstraint` alone would put the JSON where the
    header belongs).

    Raises:
        InvalidRequest: the schema is not an object or cannot be compiled.
    """
    if not isinstance(schema, dict):
        raise InvalidRequest("a JSON schema must be an object")
    sym = _Symbols(tokenizer)
    lead = "analysis? " if analysis else ""
    lark = (
        f"{_free_text(sym)}\n"
        f'start: {lead}{sym.channel} "final" {sym.message} answer\n'
        f"answer: {json_rule(schema)}\n"
    )
    try:
        return GrammarConstraint.from_lark(tokenizer, lark)
    except ValueError as exc:
        raise InvalidRequest(f"invalid JSON schema: {exc}") from exc


def _free_text(sym: _Symbols) -> str:
    """The TEXT terminal and the `analysis` message rule."""
    analysis = f'analysis: {sym.channel} "analysis" {sym.message} TEXT {sym.next}'
    return f"TEXT: {text_without('<|')}\n{analysis}"


class _Symbols:
    """Harmony's special tokens as lark symbols for one tokenizer."""

    def __init__(self, tokenizer: TokenizerWrapper) -> None:
        self.start = markup_symbol(tokenizer, "<|start|>")
        self.end = markup_symbol(tokenizer, "<|end|>")
        self.message = markup_symbol(tokenizer, "<|message|>")
        self.channel = markup_symbol(tokenizer, "<|channel|>")
        self.constrain = markup_symbol(tokenizer, "<|constrain|>")
        self.call = markup_symbol(tokenizer, "<|call|>")
        # What follows a message that is not the last one.
        self.next = f'{self.end} {self.start} "assistant"'
