"""Thinking budget: cut a think span after N tokens by forcing its closing marker.

Anthropic's `thinking.budget_tokens` bounds how much the model thinks. Local models have no such
knob, so a logits processor counts the tokens generated inside the think span and, once the
budget is spent, forces the think-end token(s); the model then continues with its answer as it
would after closing the span itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import cast

import mlx.core as mx

# Tokens a processor can take back (more than a step ever drafts).
ROLLBACK_WINDOW = 64


class ThinkingBudget:
    """mlx-lm logits processor enforcing a thinking budget for one sequence.

    Like the grammar processors, the first call's `tokens` is the prompt (nothing sampled yet);
    each later call has the previously sampled token(s) appended, which are observed to follow
    the think span: entering on `start_ids`, leaving on `end_ids`.

    Args:
        budget: thinking tokens allowed before the span is closed (at least 1).
        start_ids: token ids of the think-start marker (e.g. `<think>`).
        end_ids: token ids of the think-end marker (e.g. `</think>`).
        inside: the rendered prompt already opened the span.
    """

    def __init__(
        self, budget: int, start_ids: Sequence[int], end_ids: Sequence[int], *, inside: bool
    ) -> None:
        if budget < 1 or not start_ids or not end_ids:
            raise ValueError("a thinking budget needs budget >= 1 and both markers")
        self.budget = budget
        self._start = tuple(start_ids)
        self._end = tuple(end_ids)
        self.inside = inside
        self.spent = 0  # thinking tokens generated so far (all spans together)
        self.cut = False  # the span was closed by force at least once
        self._seen: int | None = None
        self._tail: list[int] = []  # recent tokens, to match multi-token markers
        self._forcing: int | None = None  # index into `end_ids` being forced
        # The state before each recent observed token, for `rollback` (speculative decoding
        # shows drafted tokens, then takes the rejected ones back).
        self._before: deque[tuple[bool, int, bool, list[int], int | None]] = deque(
            maxlen=ROLLBACK_WINDOW
        )

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        n = int(tokens.shape[0])
        if self._seen is None:
            self._seen = n
        elif n > self._seen:
            for token in cast(list[int], tokens[self._seen :].tolist()):
                self._observe(token)
            self._seen = n
        if not (self.inside and self.spent >= self.budget):
            return logits
        if self._forcing is None:
            self._forcing = 0
            self.cut = True
        target = self._end[self._forcing]
        vocab = logits.shape[-1]
        return mx.where(mx.arange(vocab) == target, logits, mx.array(-mx.inf, logits.dtype))

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens observed, as if they had never been shown."""
        if n <= 0 or self._seen is None:
            return
        if n > len(self._before):
            raise ValueError(f"cannot roll back {n} tokens (at most {len(self._before)})")
        state = self._before[-n]
        for _ in range(n):
            self._before.pop()
        self.inside, self.spent, self.cut, tail, self._forcing = state
        self._tail = list(tail)
        self._seen -= n

    def _observe(self, token: int) -> None:
        self._before.append((self.inside, self.spent, self.cut, self._tail, self._forcing))
        if self._forcing is not None:
            self._forcing += 1
            if self._forcing >= len(self._end):
                self._leave()
            return
        self._tail = [*self._tail, token][-max(len(self._start), len(self._end)) :]
        if self.inside:
            if tuple(self._tail[-len(self._end) :]) == self._end:
                self._leave()
            else:
                self.spent += 1
        elif tuple(self._tail[-len(self._start) :]) == self._start:
            self.inside = True
            self._tail = []

    def _leave(self) -> None:
        self.inside = False
        self._forcing = None
        self._tail = []
