"""Draft tokens for speculative decoding, and how many of them a step should verify.

A coding agent's output is full of copies of its context: an `Edit`'s `old_string` is text
the agent just read, a `Write` often rewrites a file from a tool result, `apply_patch` repeats
context lines. `PromptLookup` proposes the continuation of the most recent earlier occurrence
of a sequence's last few tokens (prompt lookup decoding: no second model), looked up in an
index of n-grams that grows with the sequence, so a proposal costs a few dictionary lookups.

Whether drafting pays depends on the machine: a verify pass of k+1 tokens costs about one
decode step where decode is bound by memory bandwidth (a GPU), and up to k+1 steps where it is
bound by compute (a CPU with a larger model). `DraftWidth` therefore learns both sides: each
sequence's acceptance rate (`Acceptance`, a decaying count of accepted and rejected drafts)
and the batch's step time at each pass width, and picks the width that maximises tokens per
second — none when nothing is likely to be accepted, so a workload without copies runs
plain decode steps.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mlxlaunch.engine.runtime.row_cache import rollback_capable

# n-gram sizes matched against the context, longest first: a longer match is likelier to
# continue the same way; below 2 tokens almost everything matches something.
MAX_NGRAM = 4
MIN_NGRAM = 2
# Most tokens one sequence drafts in a step.
MAX_DRAFT = 8


class PromptLookup:
    """Drafts for one sequence from its own context (prompt and output so far).

    `extend` appends tokens as the sequence grows; `propose(k)` returns up to k tokens that
    followed the latest earlier occurrence of the longest matching suffix (2–4 tokens).

    The index maps a hash of each n-gram to the position after its latest occurrence. It is
    built with NumPy (a 20k-token prompt in a few milliseconds, where a loop over tuples took
    ~150 ms of the GIL) and grows by a few hashes per token. A hash collision is caught when
    the match is read back; a wrong draft would only be rejected anyway.
    """

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = list(tokens)
        self._after: list[dict[int, int]] = [{} for _ in range(MAX_NGRAM + 1)]
        seq = np.asarray(self.tokens, dtype=np.uint64)
        for n in range(MIN_NGRAM, MAX_NGRAM + 1):
            if len(seq) <= n:
                break
            # The n-grams with a token after them: those starting at 0 .. len - n - 1.
            hashes = np.zeros(len(seq) - n, dtype=np.uint64)
            with np.errstate(over="ignore"):
                for offset in range(n):
                    hashes = hashes * _MIX + seq[offset : len(seq) - n + offset] + np.uint64(1)
            starts = np.arange(n, len(seq), dtype=np.int64)
            self._after[n] = dict(zip(hashes.tolist(), starts.tolist(), strict=True))

    def extend(self, tokens: Sequence[int]) -> None:
        seq = self.tokens
        for token in tokens:
            seq.append(token)
            end = len(seq) - 1  # the new token's position: a continuation start
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                if end - n < 0:
                    break
                self._after[n][_hash(seq, end - n, end)] = end

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens likely to follow the sequence (empty: no earlier match)."""
        seq = self.tokens
        if k <= 0:
            return []
        length = len(seq)
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if length <= n:
                continue
            at = self._after[n].get(_hash(seq, length - n, length))
            if at is not None and seq[at - n : at] == seq[length - n :]:
                return seq[at : at + k]
        return []


# Multiplier of the n-gram hash (odd, so every step is a bijection of 64-bit words).
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MASK = (1 << 64) - 1


def _hash(seq: list[int], start: int, end: int) -> int:
    """The hash `PromptLookup` files `seq[start:end]` under (as NumPy computes it)."""
    h = 0
    for token in seq[start:end]:
        h = (h * int(_MIX) + token + 1) & _MASK
    return h


@dataclass
class Acceptance:
    """How often one sequence's drafts are accepted, weighted towards recent steps.

    Each verified draft position is a trial until the first rejection. Counts decay, so a
    sequence that stops copying stops drafting within a few steps, and one that was given up
    on is tried again after a while (the estimate drifts back towards the prior)."""

    accepted: float = 0.0
    rejected: float = 0.0
    decay: float = 0.8
    prior: float = 0.5  # the rate assumed for a sequence not seen yet (as two trials)

    @property
    def rate(self) -> float:
        return (self.accepted + 2 * self.prior) / (self.accepted + self.rejected + 2)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.accepted = self.accepted * self.decay + accepted
        self.rejected = self.rejected * self.decay + (1 if accepted < drafted else 0)

    def idle(self) -> None:
        """A step in which this sequence had a proposal but did not draft."""
        self.accepted *= self.decay
        self.rejected *= self.decay

    def expected_tokens(self, k: int) -> float:
        """Tokens a step yields with `k` drafts: the first always, then each draft while the
        drafts before it were accepted."""
        rate = min(self.rate, 0.999)
        return 1.0 + rate * (1.0 - rate**k) / (1.0 - rate)


# The predicted gain in tokens per second a wider pass must show over the best narrower one:
# step times on a shared machine are noisy, and a misjudged width costs more than it gains.
MIN_GAIN = 1.08
# Samples of step time kept per pass width (the median is used: one preempted step must not
# decide the width for long).
STEP_SAMPLES = 9
# Plain steps in a row, while some sequence had a proposal, after which one step drafts anyway
# (two tokens): a workload can start copying after a stretch that did not, and only drafting
# tells. On a machine where drafting never pays this costs ~2% of steps.
PROBE_EVERY = 64
# Steps a width not measured yet is held once chosen: a step's time is only known after two
# passes of one width in a row (passes overlap), so a width tried once would stay unmeasured.
PROBE_STEPS = 3
# What a pass of w tokens is assumed to cost, in plain decode steps, before it is measured:
# optimistic, so that widths get tried and measured at all.
PRIOR_COST_PER_TOKEN = 0.05


@dataclass
class DraftWidth:
    """Chooses how many tokens each step's forward pass verifies, from measured step times."""

    max_draft: int = MAX_DRAFT
    _times: dict[int, deque[float]] = field(default_factory=dict)
    # Every sequence's verified drafts together: where a new sequence starts from.
    recent: Acceptance = field(default_factory=lambda: Acceptance(decay=0.95))
    _undrafted: int = 0  # plain steps in a row despite proposals
    _held: tuple[int, int] | None = None  # (drafts, steps left) of a width being measured

    def cost(self, width: int) -> float:
        """A pass of `width` tokens per sequence, in plain (width 1) steps: measured, else
        interpolated between measured widths (extended past the widest one along its last
        segment), else the prior."""
        if width <= 1:
            return 1.0
        base = self._median(1)
        if base is None:
            return 1.0 + PRIOR_COST_PER_TOKEN * (width - 1)
        known = [(1, 1.0)] + [
            (w, max(1.0, m / base))
            for w in sorted(self._times)
            if w > 1 and (m := self._median(w)) is not None
        ]
        if len(known) == 1:
            return 1.0 + PRIOR_COST_PER_TOKEN * (width - 1)
        for (w0, c0), (w1, c1) in itertools.pairwise(known):
            if w0 <= width <= w1:
                return c0 + (c1 - c0) * (width - w0) / (w1 - w0)
        (w0, c0), (w1, c1) = known[-2], known[-1]
        slope = max((c1 - c0) / (w1 - w0), 0.0)
        return c1 + slope * (width - w1)

    def _median(self, width: int) -> float | None:
        samples = self._times.get(width)
        return statistics.median(samples) if samples else None

    def observe(self, width: int, seconds: float) -> None:
        """One decode step at `width` took `seconds` (start to start, as a stream sees it)."""
        self._times.setdefault(width, deque(maxlen=STEP_SAMPLES)).append(seconds)

    def choose(self, available: Sequence[int], rates: Sequence[Acceptance]) -> int:
        """The drafts per sequence for the next pass (0: a plain step).

        `available[i]`: tokens sequence i could draft (its proposal's length, capped by what
        it may still generate); `rates[i]`: its acceptance."""
        top = min(self.max_draft, max(available, default=0))
        if top <= 0:
            return 0
        if self._held is not None:
            held, left = self._held
            self._held = (held, left - 1) if left > 1 else None
            return min(held, top)
        best, best_gain = 0, float(len(available))  # a plain step: one token each
        for k in range(1, top + 1):
            tokens = sum(
                rate.expected_tokens(min(k, n)) if n > 0 else 1.0
                for n, rate in zip(available, rates, strict=True)
            )
            gain = tokens / self.cost(k + 1)
            if gain > best_gain * MIN_GAIN:  # a width must earn its keep clearly
                best, best_gain = k, gain
        if best == 0:
            self._undrafted += 1
            if self._undrafted >= PROBE_EVERY:
                best = min(top, 2)
        if best > 0:
            self._undrafted = 0
            if self._median(best + 1) is None:
                self._held = (best, PROBE_STEPS - 1)
        return best

    def start(self) -> Acceptance:
        """The acceptance a new sequence starts with: what the batch's drafts have had."""
        return Acceptance(prior=self.recent.rate)


def speculation_unavailable(
    mode: str, model: object, *, cluster: bool, draft: object = None
) -> str | None:
    """Why sequences of `model` cannot be decoded speculatively under `mode` (None: they
    can), in words for a log line or an error; `draft`: the draft model, if one is used."""
    if mode == "off":
        return "--speculate off"
    if cluster:
        return "a cluster serve decodes in lockstep without drafts"
    reason = rollback_capable(model)
    if reason is not None:
        return f"the model cannot draft: {reason}"
    reason = rollback_capable(draft) if draft is not None else None
    return f"the draft model cannot draft: {reason}" if reason is not None else None
