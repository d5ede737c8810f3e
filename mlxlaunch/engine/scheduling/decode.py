"""The decoding sequences of the batch: one forward pass per step for all, drafts verified in it.

Each step feeds every sequence its next input token and, where it has drafts (speculative
decoding, engine/decoding/drafting.py), the drafted tokens after it: one pass of shape
(sequences, 1 + drafts). The logits at each position are processed (grammars, budgets,
penalties) and sampled exactly as a plain step would process and sample them, with the drafts
before that position as context; a draft is accepted while it equals what was sampled at its
position. So every emitted token is what plain decoding would have emitted after the same
tokens: with greedy decoding the output is token for token the plain output, with sampling it
has the same distribution (each token is a sample of the target distribution given the actual
prefix; a rejected draft is replaced by that sample). Each sequence then keeps the KV of its
accepted run and rolls the rest back (runtime/row_cache.py), and its logits processors are
rolled back with it.

The pass is pipelined as mlx-lm's own loop is: `issue` builds it and starts its evaluation,
`resolve` (at the start of the next step) waits for it and accepts. Between the two the worker
parses, detokenizes and sends the previous step's tokens while the model computes.

A sequence drafts only where everything that shapes its tokens can follow a rollback: its
caches (plain KV caches held as `RowKVCache`) and each of its logits processors (a `rollback`
method, or `stateless`). Others decode one token per step beside the drafters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx

from mlxlaunch.engine.decoding.draft_model import DraftModel
from mlxlaunch.engine.decoding.drafting import Acceptance, DraftWidth, PromptLookup
from mlxlaunch.engine.runtime.row_cache import RowKVCache
from mlxlaunch.engine.runtime.vision import set_row_shifts, text_only

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


def can_roll_back(processors: Sequence[Any]) -> bool:
    """Whether a sequence with these logits processors can be decoded speculatively."""
    return all(
        getattr(p, "stateless", False) or callable(getattr(p, "rollback", None)) for p in processors
    )


@dataclass
class Row:
    """One decoding sequence."""

    uid: int
    tokens: list[int]  # the tokens whose KV the caches hold, in order
    pending: int  # the next input: sampled (or the prompt's last token), not yet in the cache
    max_tokens: int
    sampler: Sampler | None
    processors: list[Processor]
    may_draft: bool = False  # its processors and caches can follow a rollback
    drafter: PromptLookup | None = None  # its prompt-lookup drafts (None with a draft model)
    generated: int = 0
    acceptance: Acceptance = field(default_factory=Acceptance)
    drafted: int = 0  # tokens proposed for this sequence so far
    accepted: int = 0  # of which accepted
    shift: int = 0  # the rotary shift of the images in its prompt (runtime/vision.py)

    def remaining(self) -> int:
        return self.max_tokens - self.generated


@dataclass
class Emitted:
    """What one step produced for a sequence."""

    uid: int
    tokens: list[int]
    finish_reason: str | None = None  # "stop": the last token is a stop token; "length"
    drafted: int = 0
    accepted: int = 0
    # A finished sequence's per-layer caches and the tokens they hold (its prompt and output
    # but the last token), set as it leaves the batch.
    held: tuple[list[Any], list[int]] | None = None


@dataclass
class _Pass:
    """A forward pass in flight: what each row was fed after its input, and the samples.

    With a draft model the drafts may still be lazy (`lazy`, (rows, k)): each row then uses
    the first `usable[i]` of them, read when the pass resolves."""

    drafts: list[list[int]]
    width: int
    samples: list[mx.array]  # one (width,) array per row
    started: float
    lazy: mx.array | None = None
    usable: list[int] | None = None
    proposed: list[list[int]] | None = None  # the draft model's whole proposals, when read


class DecodeBatch:
    """The batch's decoding rows and their per-layer caches."""

    def __init__(
        self,
        model: Any,
        fallback_sampler: Sampler,
        stop_tokens: set[int],
        width: DraftWidth | None,
        clock: Callable[[], float] = time.perf_counter,
        draft_model: DraftModel | None = None,
        vision: Any = None,
    ) -> None:
        self.model = model
        self.vision = vision  # told each row's rotary shift before a pass (runtime/vision.py)
        self.draft_model = draft_model  # drafts for every row (else prompt lookup per row)
        self.fallback_sampler = fallback_sampler
        self.stop_tokens = stop_tokens
        self.width = width  # None: never draft
        self._clock = clock
        self.rows: list[Row] = []
        self.caches: list[Any] = []
        self._inflight: _Pass | None = None
        # (when, width) of the last pass, and the width of the one before it.
        self._last_issue: tuple[float, int, int | None] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def speculative(self) -> bool:
        return self.width is not None and all(isinstance(c, RowKVCache) for c in self.caches)

    # --- membership -----------------------------------------------------------------------

    def join(self, rows: list[Row], caches: list[Any]) -> None:
        """Add rows whose caches (per layer, batch caches of those rows) hold all of their
        tokens but `pending` (nothing may be in flight)."""
        assert self._inflight is None
        if self.width is not None:
            caches = [RowKVCache.of_batch(c) if _plain_batch(c) else c for c in caches]
        if not self.rows:
            self.caches = caches
        else:
            for mine, theirs in zip(self.caches, caches, strict=True):
                mine.extend(theirs)
        if self.width is not None:
            for row in rows:
                row.acceptance = self.width.start()
        self.rows += rows
        if self.draft_model is not None and self.speculative:
            self.draft_model.join([row.tokens for row in rows])

    def leave(self, keep: list[int]) -> None:
        """Keep only the rows at indices `keep` (nothing may be in flight)."""
        assert self._inflight is None
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if self.draft_model is not None and self.draft_model.rows:
            self.draft_model.leave(keep)
        if not keep:
            self.caches = []
            self._last_issue = None
            return
        for cache in self.caches:
            cache.filter(keep)

    def extract(self, index: int) -> list[Any]:
        """Row `index`'s caches, per layer (copies), holding exactly `rows[index].tokens`."""
        assert self._inflight is None
        return [cache.extract(index) for cache in self.caches]

    # --- one step -------------------------------------------------------------------------

    def issue(self, *, timed: bool = True) -> None:
        """Build and start this step's forward pass over every row. `timed`: the time since
        the last pass was all decoding (no prefill, no joins), so it measures that width."""
        assert self._inflight is None
        if not self.rows:
            return
        now = self._clock()
        last = self._last_issue
        # Passes overlap (the next is issued while the last computes), so the time between
        # two issues is partly the pass before: it measures a width only after two passes of
        # that width in a row (else plain steps after wide ones look dear, and the reverse).
        if timed and last is not None and last[1] == last[2] and self.width is not None:
            self.width.observe(last[1], now - last[0])
        lazy, usable = self._model_drafts()
        if lazy is not None and usable is not None:
            drafts: list[list[int]] = [[] for _ in self.rows]
            width = 1 + int(lazy.shape[1])
            proposed: list[list[int]] | None = None
            if any(row.processors for row in self.rows):  # their contexts need the tokens
                proposed = _listed(lazy)
                drafts = self._checked([d[:n] for d, n in zip(proposed, usable, strict=True)])
                usable, lazy = None, None
            pending = mx.array([row.pending for row in self.rows])[:, None]
            inputs = mx.concatenate([pending, self._fed(lazy, drafts, width)], axis=1)
        else:
            proposed = None
            drafts = self._drafts()
            width = 1 + max(len(d) for d in drafts)
            inputs = mx.array(
                [
                    [row.pending, *d] + [row.pending] * (width - 1 - len(d))  # filler
                    for row, d in zip(self.rows, drafts, strict=True)
                ]
            )
        if self.vision is not None:
            set_row_shifts(self.vision, [row.shift for row in self.rows], prefill=False)
        logits = self.model(inputs, cache=self.caches)  # (rows, width, vocab)
        samples = self._sample(logits, drafts, width)
        # The caches too: a processor that decides a token without reading the logits (a
        # forced token) would leave the forward pass out of the samples' graph, and its KV
        # writes would pile up lazily, one pass per step, until something read the cache (8 s
        # for 2,000 tokens in one step on the medium test model). Already computed with the
        # samples otherwise, so asking costs a look at each array.
        mx.async_eval(samples, [cache.state for cache in self.caches], lazy)
        self._inflight = _Pass(drafts, width, samples, now, lazy, usable, proposed)
        self._last_issue = (now, width, last[1] if last is not None else None)

    def resolve(self) -> list[Emitted]:
        """Wait for the pass in flight and accept: each row's new tokens (none in flight: [])."""
        flight, self._inflight = self._inflight, None
        if flight is None:
            return []
        mx.eval(flight.samples)
        proposed: list[list[int]] = []
        if flight.lazy is not None:
            proposed = _listed(flight.lazy)
        elif flight.proposed is not None:
            proposed = flight.proposed
        if flight.lazy is not None and flight.usable is not None:
            flight.drafts = [d[:n] for d, n in zip(proposed, flight.usable, strict=True)]
        out: list[Emitted] = []
        rollback: list[int] = []
        for row, drafts, samples in zip(self.rows, flight.drafts, flight.samples, strict=True):
            sampled = cast(list[int], samples.tolist())
            accepted = 0
            while accepted < len(drafts) and sampled[accepted] == drafts[accepted]:
                accepted += 1
            new = [*drafts[:accepted], sampled[accepted]]
            emitted = self._emit(row, new)
            # The pass wrote `width` positions: the input, then one per draft (or filler).
            kept = 1 + (len(emitted.tokens) - 1 if emitted.finish_reason else accepted)
            rollback.append(flight.width - kept)
            row.tokens += [row.pending, *new[: kept - 1]]
            row.pending = new[-1] if emitted.finish_reason is None else emitted.tokens[-1]
            if drafts:
                row.acceptance.observe(len(drafts), accepted)
                if self.width is not None:
                    self.width.recent.observe(len(drafts), accepted)
                row.drafted += len(drafts)
                row.accepted += accepted
                emitted.drafted, emitted.accepted = len(drafts), accepted
                if emitted.finish_reason is None and accepted < len(drafts):
                    for processor in row.processors:
                        rewind = getattr(processor, "rollback", None)
                        if rewind is not None:
                            rewind(len(drafts) - accepted)
            if row.drafter is not None:
                row.drafter.extend(emitted.tokens)
            out.append(emitted)
        if any(rollback):
            for cache in self.caches:
                cache.rollback(rollback)
        if proposed and self.draft_model is not None:
            self.draft_model.settle(proposed, [[*row.tokens, row.pending] for row in self.rows])
        return out

    def resolve_now(self) -> list[Emitted]:
        """Resolve the pass in flight, if any (before the rows change)."""
        return self.resolve() if self._inflight is not None else []

    # --- inside a step --------------------------------------------------------------------

    def _model_drafts(self) -> tuple[mx.array | None, list[int] | None]:
        """The draft model's drafts for this pass (lazy, (rows, k)) and how many of them each
        row may use (0 for a row that does not draft); (None, None): no draft model, or a
        plain step."""
        draft, width = self.draft_model, self.width
        if draft is None or width is None or not self.speculative or not draft.rows:
            return None, None
        rooms = [
            min(width.max_draft, row.remaining() - 1) if row.may_draft else 0 for row in self.rows
        ]
        k = width.choose(rooms, [row.acceptance for row in self.rows])
        if k <= 0:
            return None, None
        lazy = draft.propose([[*row.tokens, row.pending] for row in self.rows], k)
        return lazy, [max(0, min(k, room)) for room in rooms]

    def _checked(self, drafts: list[list[int]]) -> list[list[int]]:
        """Each row's drafts cut to what its processors allow."""
        return [
            _valid_prefix(row.processors, [*row.tokens, row.pending], d) if d else d
            for row, d in zip(self.rows, drafts, strict=True)
        ]

    @staticmethod
    def _fed(lazy: mx.array | None, drafts: list[list[int]], width: int) -> mx.array:
        """What follows each row's input in the pass: the draft model's tokens as proposed
        (the lazy ones), else the host drafts padded with their first token."""
        if lazy is not None:
            return lazy.astype(mx.int32)
        return mx.array([(d + [d[0] if d else 0] * width)[: width - 1] for d in drafts])

    def _drafts(self) -> list[list[int]]:
        """Each row's drafts for this pass (all empty: a plain step)."""
        width = self.width
        if width is None or not self.speculative:
            return [[] for _ in self.rows]
        proposals: list[list[int]] = []
        for row in self.rows:
            room = min(width.max_draft, row.remaining() - 1)
            drafter = row.drafter if row.may_draft else None
            proposal = drafter.propose(room) if drafter is not None and room > 0 else []
            proposal = text_only(proposal)  # an image's ids are never written, so never drafted
            proposals.append(proposal)
        k = width.choose([len(p) for p in proposals], [row.acceptance for row in self.rows])
        drafts: list[list[int]] = []
        for row, proposal in zip(self.rows, proposals, strict=True):
            mine = proposal[:k]
            if mine:
                mine = _valid_prefix(row.processors, [*row.tokens, row.pending], mine)
            elif proposal:
                row.acceptance.idle()
            drafts.append(mine)
        return drafts

    def _sample(self, logits: mx.array, drafts: list[list[int]], width: int) -> list[mx.array]:
        """The token sampled at each position of each row: one (width,) array per row.

        As mlx-lm's batch samples: logits processors row by row (each position with the
        drafts before it as context), logprobs, then one sampler call for the whole batch
        when every row shares one, else a call per row."""
        rows = self.rows
        if any(row.processors for row in rows):
            processed = []
            for e, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
                if not row.processors:
                    processed.append(logits[e])
                    continue
                context = [*row.tokens, row.pending]
                positions = []
                for j in range(width):
                    scores = logits[e, j : j + 1]
                    if j <= len(draft):
                        tokens = mx.array(context + draft[:j])
                        for processor in row.processors:
                            scores = processor(tokens, scores)
                    positions.append(scores)
                processed.append(mx.concatenate(positions, axis=0))
            logits = mx.stack(processed)
        samplers = [row.sampler or self.fallback_sampler for row in rows]
        if all(s is greedy for s in samplers):  # argmax needs no normalising: fewer ops
            return list(mx.argmax(logits, axis=-1))
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if all(s is samplers[0] for s in samplers):
            flat = samplers[0](logprobs.reshape(-1, logprobs.shape[-1]))
            return list(flat.reshape(len(rows), width))
        return [sampler(logprobs[e]) for e, sampler in enumerate(samplers)]

    def _emit(self, row: Row, new: list[int]) -> Emitted:
        """`new` as the row emits it: cut after a stop token or at the row's max_tokens."""
        tokens: list[int] = []
        for token in new:
            tokens.append(token)
            row.generated += 1
            if token in self.stop_tokens:
                return Emitted(row.uid, tokens, "stop")
            if row.generated >= row.max_tokens:
                return Emitted(row.uid, tokens, "length")
        return Emitted(row.uid, tokens)


def greedy(logprobs: mx.array) -> mx.array:
    """The sampler of sequences that set none: argmax."""
    return mx.argmax(logprobs, axis=-1)


def _plain_batch(cache: Any) -> bool:
    from mlx_lm.models.cache import BatchKVCache

    return type(cache) is BatchKVCache


def _valid_prefix(processors: Sequence[Any], context: list[int], drafts: list[int]) -> list[int]:
    """The drafts every processor can follow after `context` (a grammar allows only so many
    of them)."""
    for processor in processors:
        check = getattr(processor, "valid_prefix", None)
        if check is not None and drafts:
            drafts = drafts[: check(context, drafts)]
    return drafts


def _listed(tokens: mx.array) -> list[list[int]]:
    return cast(list[list[int]], tokens.tolist())
