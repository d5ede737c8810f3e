"""Drafts from a small model with the main model's vocabulary (`--draft-model`).

For every decoding sequence of the batch, the draft model keeps its own KV cache of the
sequence (one `RowKVCache` per layer, rows in the batch's order) and proposes k tokens a step
by k greedy forward passes over all rows at once. The passes are left lazy: the main model's
verify pass takes their tokens as its input in the same graph, so drafting and verifying are
one evaluation, started by the batch's `issue` and awaited by its `resolve` (no extra
synchronisation per step). Only sequences with logits processors (grammars, budgets) need
their drafts on the host before the verify pass is built: then the drafts are evaluated first.

After verification each row's draft cache is cut back to what the sequence accepted
(`settle`); the tokens it has not seen yet (the sampled token, and the last draft when all
were accepted) are fed at the start of the next step's first pass. A sequence joining the
batch is prefilled into the draft model from the draft model's own prefix cache, so a long
conversation's next turn costs the draft model only its new tokens, as it costs the main one.

Greedy drafts are point guesses: the batch accepts a draft only where it equals what the main
model samples at that position, so the output is exactly the main model's whatever the draft
model proposes (decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlaunch.engine.runtime.row_cache import RowKVCache

Retain = Any  # a PrefixCache (engine/cache/), or None


@dataclass
class _Held:
    """What the draft cache holds of one sequence: exactly these tokens."""

    tokens: list[int]


class DraftModel:
    """A draft model's view of the batch's decoding rows."""

    def __init__(
        self, model: Any, vocab_size: int, *, prefill_chunk: int = 512, prefix: Retain = None
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's: logits past it are padding
        self.prefill_chunk = prefill_chunk
        self.prefix = prefix
        self.rows: list[_Held] = []
        self.caches: list[RowKVCache] = []

    # --- membership -----------------------------------------------------------------------

    def join(self, contexts: Sequence[list[int]]) -> None:
        """Rows joining the batch, each with the tokens the main model's cache holds."""
        layers: list[list[KVCache]] = []
        for tokens in contexts:
            caches, held = self._prefilled(tokens)
            layers.append(caches)
            self.rows.append(_Held(held))
        per_layer = zip(*layers, strict=True)
        batch = [RowKVCache.of_sequences(list(caches)) for caches in per_layer]
        if not self.caches:
            self.caches = batch
        else:
            for mine, theirs in zip(self.caches, batch, strict=True):
                mine.extend(theirs)

    def _prefilled(self, tokens: list[int]) -> tuple[list[Any], list[int]]:
        """A single-sequence draft cache holding `tokens` (from the prefix cache where it
        has them, the rest prefilled in chunks)."""
        caches: list[Any] | None = None
        start = 0
        if self.prefix is not None and len(tokens) > 1:
            plan = self.prefix.plan(tokens)
            if plan.caches is not None:
                caches, start = plan.caches, plan.cached_tokens
        if caches is None:
            caches = list(make_prompt_cache(self.model))
        for at in range(start, len(tokens), self.prefill_chunk):
            chunk = tokens[at : at + self.prefill_chunk]
            self.model(mx.array([chunk]), cache=caches)
            mx.eval([c.state for c in caches])
        return caches, list(tokens)

    def leave(self, keep: list[int]) -> None:
        """Keep only the rows at `keep`; the others' draft KV goes to the prefix cache."""
        gone = [i for i in range(len(self.rows)) if i not in set(keep)]
        if self.prefix is not None:
            for i in gone:
                held = self.rows[i].tokens
                if held:
                    self.prefix.retain(held, [cache.extract(i) for cache in self.caches])
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.caches = []
            return
        for cache in self.caches:
            cache.filter(keep)

    # --- drafting -------------------------------------------------------------------------

    def propose(self, contexts: Sequence[list[int]], k: int) -> mx.array:
        """`k` greedy draft tokens for each row (a lazy (rows, k) array). `contexts[i]`: row
        i's whole sequence so far, its next input last."""
        lags = [ctx[len(held.tokens) :] for ctx, held in zip(contexts, self.rows, strict=True)]
        width = max(len(lag) for lag in lags)
        # The first pass feeds what each row's draft cache has not seen (at least the input);
        # shorter rows are padded at the end and rolled back after.
        inputs = mx.array([lag + [lag[-1]] * (width - len(lag)) for lag in lags])
        logits = self.model(inputs, cache=self.caches)
        last = mx.array([len(lag) - 1 for lag in lags])
        scores = mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
        if width > 1:
            for cache in self.caches:
                cache.rollback([width - len(lag) for lag in lags])
        drafts = [self._greedy(scores)]
        for _ in range(k - 1):
            drafts.append(self._greedy(self.model(drafts[-1][:, None], cache=self.caches)[:, -1]))
        for held, lag in zip(self.rows, lags, strict=True):
            held.tokens += lag
        return mx.stack(drafts, axis=1)

    def _greedy(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[..., : self.vocab_size], axis=-1)

    def settle(self, proposed: Sequence[list[int]], contexts: Sequence[list[int]]) -> None:
        """After verification: each row's draft cache keeps the drafts its sequence accepted.
        `proposed[i]`: the drafts row i was given (all k, as the draft passes fed k - 1 of
        them); `contexts[i]`: the sequence now, its next input last."""
        cuts: list[int] = []
        for held, drafts, ctx in zip(self.rows, proposed, contexts, strict=True):
            fed = drafts[:-1]  # the last draft was proposed, never fed
            base = len(held.tokens)
            kept = 0
            while kept < len(fed) and base + kept < len(ctx) - 1 and ctx[base + kept] == fed[kept]:
                kept += 1
            cuts.append(len(fed) - kept)
            held.tokens += fed[:kept]
        if any(cuts):
            for cache in self.caches:
                cache.rollback(cuts)
