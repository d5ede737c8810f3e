"""Constrained decoding: grammars (JSON schemas, tool-call markup) as mlx-lm logits processors.

A *constraint* is a compiled llguidance grammar bound to one tokenizer; it is built once per
request (or reused across requests) and hands out a fresh *processor* per generated sequence:

    constraint = JsonConstraint.from_schema(tokenizer, schema)
    processor = constraint.logits_processor()       # one per sequence, never shared
    BatchGenerator.insert(..., logits_processors=[[processor]])

A processor follows mlx-lm's processor protocol, `proc(tokens, logits) -> logits`, where
`tokens` is the sequence so far (1-D) and `logits` has shape (1, vocab). Both
`mlx_lm.generate.generate_step` and `BatchGenerator`/`GenerationBatch._step` make the first call
with the prompt as `tokens` (its last element is the last prompt token, not a sampled one) and
every later call with exactly one more token: the one sampled at the previous step. So the
processor takes the length of `tokens` at its first call as the prompt length, and from then on
feeds the grammar every token past what it has seen. Logits of tokens the grammar forbids become
-inf; once the grammar is complete only end-of-sequence tokens remain allowed.

Tool-call grammars live in `tool_grammar`; this module holds the machinery they share.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, cast

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.runtime.mlx_lm_internals import hf_tokenizer_of
from mlxlaunch.engine.types import InvalidRequest

log = logging.getLogger(__name__)

# JSON as models print it (json.dumps defaults): in distribution, and with no free whitespace a
# weak model cannot stall on whitespace forever. `lenient` skips schema keywords llguidance does
# not implement (format, $schema, ...) instead of refusing the whole schema.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}

_NEG_INF = float("-inf")


# --- tokenizer conversion (expensive: done once per tokenizer) ----------------------------

_llg_tokenizers: dict[int, tuple[TokenizerWrapper, llguidance.LLTokenizer]] = {}
_llg_lock = threading.Lock()


def llg_tokenizer(tokenizer: TokenizerWrapper) -> llguidance.LLTokenizer:
    """The llguidance view of an mlx-lm tokenizer, converted once and cached.

    The cache keeps the wrapper alive next to its conversion, so an id is never reused for a
    different tokenizer while its entry exists. The end-of-sequence set is the wrapper's
    `eos_token_ids` (a chat model's turn-end token, e.g. <|im_end|>, is among them).
    """
    key = id(tokenizer)
    with _llg_lock:
        hit = _llg_tokenizers.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        eos = sorted(tokenizer.eos_token_ids) or None
        converted = llguidance.hf.from_tokenizer(hf_tokenizer_of(tokenizer), eos_token=eos)
        _llg_tokenizers[key] = (tokenizer, converted)
        return converted


def forget_tokenizer(tokenizer: TokenizerWrapper) -> None:
    """Drop the cached conversion of `tokenizer` (call when the model is unloaded)."""
    with _llg_lock:
        _llg_tokenizers.pop(id(tokenizer), None)


def markup_symbol(tokenizer: TokenizerWrapper, text: str) -> str:
    """A lark symbol that produces `text`: `<[id]>` when it is one token, else a literal.

    Markup such as <tool_call> is usually one (added or special) token; llguidance cannot spell
    special tokens with bytes, and naming the id also keeps the model from spelling the marker
    in pieces, which token-based markup detection downstream would miss.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1:
        return f"<[{ids[0]}]>"
    return lark_literal(text)


def lark_literal(text: str) -> str:
    """`text` as a lark string literal (JSON string escapes are valid lark escapes)."""
    return json.dumps(text)


def json_rule(schema: dict[str, Any]) -> str:
    """A lark `%json` body for `schema`, with the compact, model-style JSON options."""
    options = schema.get("x-guidance", {})
    if not isinstance(options, dict):  # the client's mistake: a 400 (plan turns ValueError)
        raise ValueError("a schema's x-guidance must be an object")
    merged = dict(schema)
    merged["x-guidance"] = {**JSON_OPTIONS, **options}
    return "%json " + json.dumps(merged)


def text_without(marker: str) -> str:
    """A lark terminal body: any text (possibly empty) in which `marker` does not occur."""
    escaped = "".join(_regex_char(c) for c in marker)
    return f"/(?s:.*)/ & ~/(?s:.*){escaped}(?s:.*)/"


def _regex_char(char: str) -> str:
    """One character as a lark regex atom (inside /.../, so '/' needs escaping too)."""
    # Non-ASCII characters stand for themselves (DeepSeek's `｜`, `▁`); "\｜" is no escape.
    if not char.isascii() or char.isalnum() or char in " _-<>=,:;'\"":
        return char
    if char in "\n\t\r":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[char]
    return "\\" + char


def thinking_rules(
    tokenizer: TokenizerWrapper, think_end: str, *, think: bool = True
) -> tuple[str, str]:
    """Lark for the rest of an already opened think span, up to and with `think_end`.

    Used when the rendered prompt ends inside a think span: the model may think freely, then
    must close the span before the constrained part. Returns (terminal definitions, the
    sequence to put first in `start`).
    """
    end = markup_symbol(tokenizer, think_end)
    if not think:  # the request did not ask for thinking: close the span the prompt opened
        return "", f"{end} /\\n*/ "
    if end.startswith("<["):  # a single token: the text cannot run past it
        return f"THINK_TEXT: {text_without(think_end)}\n", f"THINK_TEXT {end} /\\n*/ "
    # A marker of several tokens: lexing is greedy, so the text and its end are one lazy rule
    # (else the text could swallow the marker's first tokens and never end).
    definitions = f"THINK_TEXT: {text_without(think_end)}\nthink_close[lazy]: THINK_TEXT {end}\n"
    return definitions, "think_close /\\n*/ "


# --- constraints and their processors -------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """A grammar compiled against one tokenizer; `template` is copied for each sequence."""

    grammar: str
    template: llguidance.LLMatcher
    llg: llguidance.LLTokenizer


def compile_grammar(tokenizer: TokenizerWrapper, grammar: str) -> Compiled:
    """Compile an llguidance grammar (JSON from `LLMatcher.grammar_from_*`).

    Raises:
        InvalidRequest: the grammar (a schema from the client) cannot be compiled.
    """
    llg = llg_tokenizer(tokenizer)
    template = llguidance.LLMatcher(llg, grammar, log_level=0)
    if template.is_error():
        raise InvalidRequest(f"cannot constrain output to this schema: {template.get_error()}")
    return Compiled(grammar=grammar, template=template, llg=llg)


class GrammarConstraint:
    """A compiled grammar that hands out per-sequence logits processors."""

    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled

    @classmethod
    def from_lark(cls, tokenizer: TokenizerWrapper, lark: str) -> GrammarConstraint:
        """A constraint from an llguidance lark grammar (may embed `%json {...}` rules)."""
        return cls(compile_grammar(tokenizer, llguidance.LLMatcher.grammar_from_lark(lark)))

    def logits_processor(self) -> GrammarLogitsProcessor:
        """A fresh processor for one sequence; it must not be shared between sequences."""
        return GrammarLogitsProcessor(self.compiled.template.deep_copy(), self.compiled.llg)


class JsonConstraint(GrammarConstraint):
    """Output must be one JSON value matching a JSON schema, then end of sequence."""

    @classmethod
    def from_schema(
        cls,
        tokenizer: TokenizerWrapper,
        schema: dict[str, Any],
        *,
        think_end: str | None = None,
        think: bool = True,
    ) -> JsonConstraint:
        """Compile `schema` for `tokenizer`.

        Args:
            tokenizer: the loaded model's tokenizer.
            schema: a JSON schema; an `x-guidance` key in it overrides `JSON_OPTIONS`.
            think_end: when the rendered prompt ends inside an open think span, the marker
                that closes it (e.g. "</think>"); the JSON then follows the closed span.
            think: whether the model may think before it closes that span (False: at once).

        Raises:
            InvalidRequest: the schema is not valid JSON schema or uses what cannot be compiled.
        """
        if not isinstance(schema, dict):
            raise InvalidRequest("a JSON schema must be an object")
        if not isinstance(schema.get("x-guidance", {}), dict):
            raise InvalidRequest("a JSON schema's x-guidance must be an object")
        if think_end is None:
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    schema,
                    defaults=JSON_OPTIONS,  # type: ignore[arg-type]
                )
            except ValueError as exc:
                raise InvalidRequest(f"invalid JSON schema: {exc}") from exc
        else:
            definitions, prefix = thinking_rules(tokenizer, think_end, think=think)
            lark = f"{definitions}start: {prefix}answer\nanswer: {json_rule(schema)}\n"
            grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        return cls(compile_grammar(tokenizer, grammar))


class GrammarLogitsProcessor:
    """mlx-lm logits processor that keeps one sequence inside a grammar.

    Attributes:
        error: why the grammar could not follow the sequence (None while all is well); after
            an error only end-of-sequence tokens are allowed, so generation ends soon.
        ended: an end-of-sequence token was sampled after a complete sentence.
    """

    def __init__(self, matcher: llguidance.LLMatcher, llg: llguidance.LLTokenizer) -> None:
        self._matcher = matcher
        self._seen: int | None = None  # length of `tokens` already fed to the grammar
        self._n_words = (llg.vocab_size + 31) // 32
        self._words = np.zeros((1, self._n_words), dtype=np.int32)
        self._eos_ids = [int(t) for t in llg.eos_tokens if int(t) < llg.vocab_size]
        self._neg_inf: mx.array | None = None
        self._eos_set = frozenset(self._eos_ids)
        self.error: str | None = None
        self.ended = False  # an end-of-sequence token followed a complete sentence

    @property
    def complete(self) -> bool:
        """The output so far is a full sentence of the grammar (ending here is valid)."""
        return self.error is None and (self.ended or self._matcher.is_accepting())

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        n = int(tokens.shape[0])
        if self._seen is None:
            self._seen = n  # first call: `tokens` is the prompt, nothing sampled yet
        elif n > self._seen:
            self._consume(cast(list[int], tokens[self._seen :].tolist()))
            self._seen = n
        allowed = self._allowed(int(logits.shape[-1]))
        if self._neg_inf is None or self._neg_inf.dtype != logits.dtype:
            self._neg_inf = mx.array(_NEG_INF, dtype=logits.dtype)
        return mx.where(allowed, logits, self._neg_inf)

    def _consume(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            if self.error is not None or self.ended:
                return
            if token in self._eos_set and self._matcher.is_accepting():
                # End of sequence after a complete sentence. mlx-lm's pipelined loops call us
                # once more after sampling it; a stopped matcher would count it as an error.
                self.ended = True
            elif not self._matcher.consume_token(token):
                self.error = self._matcher.get_error() or f"token {token} not allowed"
                log.warning("constrained generation left its grammar: %s", self.error[:300])

    def _allowed(self, vocab: int) -> mx.array:
        """Boolean (vocab,) mask of the tokens the grammar allows next."""
        words = self._buffer(vocab)
        grammar_words = words[:, : self._n_words]  # llguidance writes exactly its vocabulary
        if self.error is None and not self.ended:
            llguidance.numpy.fill_next_token_bitmask(self._matcher, grammar_words)
        else:
            grammar_words[:] = 0
            bits = grammar_words.view(np.uint32)[0]
            for eos in self._eos_ids:
                bits[eos // 32] |= np.uint32(1 << (eos % 32))
        # Unpacking on the host is a single vectorised pass; mx gathers are slow on CPU.
        unpacked = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
        return mx.array(unpacked.view(np.bool_))

    def _buffer(self, vocab: int) -> npt.NDArray[np.int32]:
        """Mask words covering `vocab` logits; words past the grammar's vocabulary stay zero
        (models may pad their embeddings beyond the tokenizer)."""
        n_words = max(self._n_words, (vocab + 31) // 32)
        if self._words.shape[1] != n_words:
            self._words = np.zeros((1, n_words), dtype=np.int32)
        return self._words
