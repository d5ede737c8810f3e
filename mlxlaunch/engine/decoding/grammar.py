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

Grammars are client input run on a shared server, so compilation is bounded and kept off the
shared path: inputs are checked first (`schema_limits`), llguidance runs under `PARSER_LIMITS`,
compilation and the first masks (where llguidance does its lazy, expensive lexer work) happen
on the submitting request's thread, which holds no lock any other request needs (llguidance
drops the GIL), and compiled grammars are remembered by text (`grammar_cache`). The worker then
only ever advances a warmed copy. A grammar the engine cannot honour is a 400 at submit time;
one that breaks mid-generation (an internal limit) ends its request with `ConstraintBroken`
(see `GrammarLogitsProcessor.error`), never with output that silently left the grammar.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar_cache import GrammarCache
from mlxlaunch.engine.runtime.mlx_lm_internals import hf_tokenizer_of
from mlxlaunch.engine.types import GenerationFailed, InvalidRequest

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


# Resource limits for every grammar (llguidance's defaults in brackets; its speeds: lexer fuel
# ~50k/ms at build, ~14k/ms per step, Earley items ~20k/ms). The initial fuel bounds the lazy
# regex build a first mask runs: at the default a million-position pattern spent 1-2 s there
# before failing; at 200k it fails in ~50 ms and the largest pattern `schema_limits` admits
# still builds. Per-step bounds keep one sequence from holding the whole batch for long, and
# errors stay terse (`verbose_errors` would echo parser state and schema text).
PARSER_LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=200_000,  # [1,000,000]
    step_lexer_fuel=100_000,  # [200,000]: ~7 ms
    step_max_items=50_000,  # [50,000]: ~2.5 ms
    max_items_in_row=2_000,  # [2,000]
    max_lexer_states=100_000,  # [250,000]: 1-2 kB each, shared by a cached grammar's copies
    max_grammar_size=500_000,  # [500,000]
    verbose_errors=False,
)
# The first masks computed at compile time, following tokens the grammar forces (one allowed
# token), so the lexer work and limit errors of a grammar's start happen before admission.
WARM_STEPS = 16
# CPU time (of the computing thread: steady under load, unlike wall time) one token mask may
# cost. No llguidance limit bounds the scan of a long forced run (3,000 required const
# properties: 0.45 s per token, every token), so cost itself is the last bound: a grammar whose
# masks exceed it while warming is refused, and a sequence whose masks keep exceeding it on the
# worker ends as failed. Ordinary grammars cost well under a millisecond per mask; the first
# mask builds the lexer and may cost more.
MAX_FIRST_MASK_CPU_S = 0.25
MAX_MASK_CPU_S = 0.02
SLOW_MASKS_ALLOWED = 3  # on the worker: masks over MAX_MASK_CPU_S before the sequence fails
# Tokens a processor can take back (more than a speculative step ever drafts).
ROLLBACK_WINDOW = 64


class ConstraintBroken(GenerationFailed):
    """The grammar could not follow its sequence (an internal limit of the grammar engine):
    what was generated may not match the schema, so the request fails rather than ending as
    if complete."""


# --- tokenizer facts (expensive or lock-guarded: derived once per tokenizer) --------------


@dataclass
class _TokenizerFacts:
    """What grammars need from one tokenizer, kept alive with it (so its id is not reused)."""

    tokenizer: TokenizerWrapper
    llg: llguidance.LLTokenizer
    markers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    grammars: GrammarCache[Compiled] = field(default_factory=GrammarCache)


_facts: dict[int, _TokenizerFacts] = {}
_facts_lock = threading.Lock()
MAX_MARKERS = 256  # markup strings encoded per tokenizer (a dialect has a handful)

# The lock that guards the tokenizer object (the engine's tokenizer lock), for the plan being
# built on this thread: taken only where the tokenizer itself is called, and those calls are
# remembered, so compiling and warming a grammar never holds it.
_tokenizer_lock: ContextVar[threading.Lock | None] = ContextVar("tokenizer_lock", default=None)


@contextlib.contextmanager
def guarding_tokenizer(lock: threading.Lock | None) -> Iterator[None]:
    """Within this block, calls into the tokenizer take `lock` (see `_tokenizer_lock`)."""
    token = _tokenizer_lock.set(lock)
    try:
        yield
    finally:
        _tokenizer_lock.reset(token)


def _tokenizer_use() -> contextlib.AbstractContextManager[Any]:
    lock = _tokenizer_lock.get()
    return lock if lock is not None else contextlib.nullcontext()


def _facts_of(tokenizer: TokenizerWrapper) -> _TokenizerFacts:
    key = id(tokenizer)
    with _facts_lock:
        hit = _facts.get(key)
        if hit is not None and hit.tokenizer is tokenizer:
            return hit
        eos = sorted(tokenizer.eos_token_ids) or None
        with _tokenizer_use():  # reads the whole vocabulary: once per model
            converted = llguidance.hf.from_tokenizer(hf_tokenizer_of(tokenizer), eos_token=eos)
        facts = _TokenizerFacts(tokenizer, converted)
        _facts[key] = facts
        return facts


def llg_tokenizer(tokenizer: TokenizerWrapper) -> llguidance.LLTokenizer:
    """The llguidance view of an mlx-lm tokenizer, converted once and cached.

    The cache keeps the wrapper alive next to its conversion, so an id is never reused for a
    different tokenizer while its entry exists. The end-of-sequence set is the wrapper's
    `eos_token_ids` (a chat model's turn-end token, e.g. <|im_end|>, is among them).
    """
    return _facts_of(tokenizer).llg


def grammar_cache(tokenizer: TokenizerWrapper) -> GrammarCache[Compiled]:
    """The compiled grammars remembered for `tokenizer`."""
    return _facts_of(tokenizer).grammars


def forget_tokenizer(tokenizer: TokenizerWrapper) -> None:
    """Drop the cached conversion of `tokenizer` and its compiled grammars (call when the
    model is unloaded)."""
    with _facts_lock:
        _facts.pop(id(tokenizer), None)


def encode_markup(tokenizer: TokenizerWrapper, text: str) -> tuple[int, ...]:
    """The token ids of a markup string (remembered: markers are the same every request)."""
    facts = _facts_of(tokenizer)
    ids = facts.markers.get(text)
    if ids is None:
        with _tokenizer_use():
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        if len(facts.markers) < MAX_MARKERS:
            facts.markers[text] = ids
    return ids


def markup_symbol(tokenizer: TokenizerWrapper, text: str) -> str:
    """A lark symbol that produces `text`: `<[id]>` when it is one token, else a literal.

    Markup such as <tool_call> is usually one (added or special) token; llguidance cannot spell
    special tokens with bytes, and naming the id also keeps the model from spelling the marker
    in pieces, which token-based markup detection downstream would miss.
    """
    ids = encode_markup(tokenizer, text)
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
    """Compile an llguidance grammar (JSON from `LLMatcher.grammar_from_*`), or reuse the
    compilation of an identical grammar.

    Raises:
        InvalidRequest: the grammar (a schema from the client) cannot be compiled, or is too
            complex to honour within `PARSER_LIMITS`.
    """
    facts = _facts_of(tokenizer)
    return facts.grammars.get(grammar, lambda: _compile(facts.llg, grammar))


def _compile(llg: llguidance.LLTokenizer, grammar: str) -> Compiled:
    template = llguidance.LLMatcher(llg, grammar, log_level=0, limits=PARSER_LIMITS)
    if template.is_error():
        raise InvalidRequest(f"cannot constrain output to this schema: {_reason(template)}")
    _warm(template, llg)
    return Compiled(grammar=grammar, template=template, llg=llg)


def _warm(template: llguidance.LLMatcher, llg: llguidance.LLTokenizer) -> None:
    """Run the grammar's first masks on a copy, following forced tokens.

    The lexer state these build is shared with the template and every later copy, so the
    worker's first mask is cheap; and a grammar whose start exceeds the limits, or whose masks
    cost too much (`MAX_MASK_CPU_S`), is refused here (a 400) instead of failing or stalling
    the batch on the worker after the request was accepted.
    """
    probe = template.deep_copy()
    words = np.zeros((1, (llg.vocab_size + 31) // 32), dtype=np.int32)
    eos = {int(t) for t in llg.eos_tokens}
    for step in range(WARM_STEPS):
        cost = _timed_mask(probe, words)
        if probe.is_error():
            break
        budget = MAX_FIRST_MASK_CPU_S if step == 0 else MAX_MASK_CPU_S
        if cost > budget:
            raise InvalidRequest(
                "cannot constrain output: the schema is too complex (a token mask costs "
                f"{cost * 1000:.0f} ms of CPU, at most {budget * 1000:.0f} ms): shorten its "
                "patterns, constants or required fields"
            )
        forced = _only_token(words[0])
        if forced is None or forced in eos or not probe.consume_token(forced):
            break
    if probe.is_error():
        raise InvalidRequest(f"cannot constrain output: {_reason(probe)}")


def _timed_mask(matcher: llguidance.LLMatcher, words: npt.NDArray[np.int32]) -> float:
    """Fill the next-token mask; return its cost in CPU seconds of this thread."""
    start = time.thread_time()
    llguidance.numpy.fill_next_token_bitmask(matcher, words)
    return time.thread_time() - start


def _only_token(words: npt.NDArray[np.int32]) -> int | None:
    """The single token a mask allows, or None when it allows none or several."""
    nonzero = np.flatnonzero(words)
    if len(nonzero) != 1:
        return None
    word = int(words[nonzero[0]]) & 0xFFFFFFFF
    if word & (word - 1):
        return None
    return int(nonzero[0]) * 32 + word.bit_length() - 1


def _reason(matcher: llguidance.LLMatcher) -> str:
    """llguidance's error, first line only (the rest is parser state)."""
    text = matcher.get_error().strip()
    first = text.splitlines()[0] if text else "unknown grammar error"
    if "too many expressions" in first or "too big" in first or "fuel" in first:
        first += " (the schema is too complex: shorten its patterns, enums or nesting)"
    return first[:500]


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
            an error only end-of-sequence tokens are allowed, so generation ends soon — and
            `check()` raises, so the request ends as failed, not as complete.
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
        self._slow_masks = 0
        # What each recent token did to the grammar (True: the matcher consumed it; False: it
        # ended the output), for `rollback`.
        self._recent: deque[bool] = deque(maxlen=ROLLBACK_WINDOW)

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
                self._recent.append(False)
            elif not self._matcher.consume_token(token):
                self._fail(_reason(self._matcher) if self._matcher.is_error() else "")
            else:
                self._recent.append(True)

    def valid_prefix(self, context: list[int], drafts: list[int]) -> int:
        """How many of `drafts` the grammar allows after `context` (the sequence so far, of
        which this processor has seen a prefix): drafts past that are never shown to it."""
        if self.error is not None or self.ended:
            return 0
        unseen = context[self._seen :] if self._seen is not None else []
        return max(0, int(self._matcher.validate_tokens([*unseen, *drafts])) - len(unseen))

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens shown (drafts rejected by speculative decoding)."""
        if n <= 0 or self._seen is None:
            return
        if n > len(self._recent):
            raise ValueError(f"cannot roll back {n} tokens (at most {len(self._recent)})")
        consumed = 0
        for _ in range(n):
            if self._recent.pop():
                consumed += 1
            else:
                self.ended = False
        if consumed:
            self._matcher.rollback(consumed)
        self._seen -= n

    def _fail(self, reason: str) -> None:
        self.error = reason or "a token the grammar does not allow"
        log.warning("constrained generation left its grammar: %s", self.error)

    def check(self) -> None:
        """Raise `ConstraintBroken` when the grammar could not follow this sequence.

        Raises:
            ConstraintBroken: with the grammar engine's reason.
        """
        if self.error is not None:
            raise ConstraintBroken(f"the output could not be kept to its grammar: {self.error}")

    def _allowed(self, vocab: int) -> mx.array:
        """Boolean (vocab,) mask of the tokens the grammar allows next."""
        words = self._buffer(vocab)
        grammar_words = words[:, : self._n_words]  # llguidance writes exactly its vocabulary
        if self.error is None and not self.ended:
            cost = _timed_mask(self._matcher, grammar_words)
            if self._matcher.is_error():  # a limit hit while computing the mask
                self._fail(_reason(self._matcher))
            elif cost > MAX_MASK_CPU_S:  # every sequence in the batch waits for this one
                self._slow_masks += 1
                if self._slow_masks >= SLOW_MASKS_ALLOWED:
                    self._fail(f"the grammar is too slow ({cost * 1000:.0f} ms per token)")
        if self.error is not None or self.ended:
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
