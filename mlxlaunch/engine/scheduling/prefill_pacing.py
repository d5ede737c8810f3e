"""Prefill pacing: how many prompt tokens one worker step may prefill while other streams decode.

A step gives prompt processing a slice of time, not a fixed count of tokens: while a stream
decodes, a long prompt slows it by at most about `1 + PREFILL_SHARE` (issue 19: a 40k-token
prompt had slowed four streams from 1.5 s to 27.7 s).

mlx-lm's `BatchGenerator.next()` runs one decode step of the generation batch, then one chunk of
prompt processing (`prefill_step_size` tokens of each prompt being prefilled). With a fixed chunk
a decoding stream waits a whole chunk per token, and a chunk's cost grows with its position
(attention reads every earlier token): on the medium test model a 512-token chunk at ~10k
tokens of context took ~120 ms against a 1.4 ms decode step of four streams — 84× slower.

So while some stream decodes, each step earns `share` × its decode time for prompt processing,
and a slice runs only when the prefill owes nothing: its cost (the step's time less a median
decode step's) is a debt that the following steps repay by decoding alone.
Over any stretch the prefill then takes about `share` of what the decode steps take, whatever
a token costs at that depth. A slice is sized, from the measured cost per token near the
prompt's current position, to take the larger of one step's earning and `MIN_SLICE_S`: a
forward pass has a fixed cost (~4 ms at 10k tokens of context on the medium test model, where
a decode step takes 1.5 ms), which slices of a few tokens would pay over and over. So a stream
sees a few fast steps, then one slower by at most about `MIN_SLICE_S`.

With nobody decoding, prompts prefill in full chunks (the configured `prefill_chunk`), so a
long prompt on an idle engine is as fast as before; while streams decode, its prefill gets
about `share / (1 + share)` of the machine, which is the price of the bound.

Times are wall-clock periods from one step's start to the next, as a stream sees them (the
worker's own bookkeeping included). Pacing decides from local timings, so ranks running the
worker loop in lockstep would have to take rank 0's slices, not their own.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Prefill time per step over decode time per step while some stream decodes: its steps take
# at most ~1.9x as long as alone (the goal is 2x; measured figures in the test's docstring).
PREFILL_SHARE = 0.9
# The time (seconds) a slice is sized to at least: long enough that a forward pass's fixed cost
# is a small part of it, short enough to pass unnoticed in a stream.
MIN_SLICE_S = 0.025
# A slice's size before the cost of a token is known (and its floor).
MIN_SLICE_TOKENS = 16
# A decode-only step at least this often (seconds) keeps the decode-step time current (the
# batch grows, its contexts lengthen) while a prefill would otherwise take every step.
DECODE_REFRESH_S = 0.5
# Decode-only steps whose median is the decode-step time: a step preempted by another process
# must not pass for the streams' pace (an overestimate would let the prefill take more).
DECODE_SAMPLES = 15
# Weight of the newest sample in the cost per prompt token; a sample counts at most this many
# times the running figure, so one preempted slice does not distort the pacing for long.
SMOOTHING = 0.3
OUTLIER_FACTOR = 3.0


@dataclass
class _Step:
    started: float
    slice: int  # the prompt tokens it could prefill (of each prompt)
    decoding: bool  # some stream decoded in it
    paced: bool  # it ran on credit (a stream decoding, a prompt prefilling)
    prefilled: int = 0  # the prompt tokens it did prefill (of the prompt that advanced most)


def _smoothed(running: float | None, sample: float) -> float:
    if running is None:
        return sample
    sample = min(max(sample, running / OUTLIER_FACTOR), running * OUTLIER_FACTOR)
    return running + SMOOTHING * (sample - running)


class PrefillPacer:
    """Chooses each worker step's prefill slice from the measured times of earlier steps.

    Call `plan` at the start of every step, `prefilled` once the step has run, and `pause`
    when the worker stops stepping (an idle batch): the gap until the next step is no step.
    """

    def __init__(
        self,
        max_slice: int,
        *,
        share: float = PREFILL_SHARE,
        min_slice: int = MIN_SLICE_TOKENS,
        min_slice_s: float = MIN_SLICE_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_slice = max_slice
        self.share = share
        self.min_slice = min(min_slice, max_slice)
        self.min_slice_s = min_slice_s
        self._clock = clock  # real time: pacing is about compute, not request timings
        self.decode_s: float | None = None  # one decode-only step
        self._decode_samples: deque[float] = deque(maxlen=DECODE_SAMPLES)
        self.token_s: float | None = None  # one prompt token, at the recent position
        self._debt = 0.0  # prefill time (seconds) not yet repaid by decode-only steps
        self._decode_measured_at = float("-inf")
        self._step: _Step | None = None

    def plan(self, *, decoding: bool, prefilling: bool, urgent: bool = False) -> int:
        """The slice (prompt tokens of each prompt, 0: decode only) for the step starting now.

        `decoding`: some stream in the batch is past its prompt; `prefilling`: some prompt
        still has tokens to process; `urgent`: that prompt is the main loop's turn and only
        side streams (titles, subagents, background work) decode — the main loop first: it
        prefills in full chunks, the side streams wait a chunk per token meanwhile."""
        now = self._clock()
        self._close_step(now)
        paced = decoding and prefilling and not urgent
        if not paced:
            self._debt = 0.0
            tokens = self.max_slice
        elif self.decode_s is None:
            tokens = 0  # measure what the streams' steps take without prefill first
        elif self._debt > 0 or now - self._decode_measured_at >= DECODE_REFRESH_S:
            tokens = 0
        else:
            tokens = self._affordable(max(self.share * self.decode_s, self.min_slice_s))
        self._step = _Step(now, tokens, decoding, paced)
        return tokens

    def prefilled(self, tokens: int) -> None:
        """The current step prefilled `tokens` prompt tokens (of the prompt that advanced most)."""
        if self._step is not None:
            self._step.prefilled = max(self._step.prefilled, tokens)

    def pause(self) -> None:
        """The worker stopped stepping: forget the step in progress, keep what was learnt."""
        self._step = None
        self._debt = 0.0

    def _affordable(self, seconds: float) -> int:
        if self.token_s is None:
            return self.min_slice  # a first slice to learn what a token costs here
        return max(self.min_slice, min(self.max_slice, int(seconds / self.token_s)))

    def _close_step(self, now: float) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        period = now - step.started
        if step.prefilled == 0:
            if step.decoding:
                self._decode_samples.append(period)
                self.decode_s = statistics.median(self._decode_samples)
                self._decode_measured_at = now
                # What the streams' step took is what the prefill may take a share of; a step
                # slowed by another process slows the streams anyway.
                self._debt = max(0.0, self._debt - self.share * period) if step.paced else 0.0
            return
        decode_s = self.decode_s if step.decoding and self.decode_s is not None else 0.0
        cost = period - decode_s  # the median decode step: an overestimate of the cost
        if step.paced:
            self._debt += max(cost, 0.0) - self.share * decode_s
        if cost > 0:
            self.token_s = _smoothed(self.token_s, cost / step.prefilled)
