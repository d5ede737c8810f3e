"""Rank 0's side of the lockstep: the worker tells the other ranks what it is about to do.

On a cluster only rank 0 serves HTTP, renders prompts, parses output and decides (admission,
scheduling, the prefix cache's plan); each decision that touches the model is shared with the
other ranks just before rank 0 acts on it (`Lockstep`), and they act on it in the same order
(`follower.Follower`), so every forward pass — whose collectives need all ranks — happens on
all of them at once. The tokens are rank 0's: its sampler's choice is broadcast, so grammars,
penalties and scripted output run on rank 0 alone and every rank feeds the same tokens back.

The worker calls these just before it acts (load, insert, step, remove, save, stop), so the
followers do the same things in the same order, and every collective in the forward pass
meets its partners. Any failure to reach a rank is `ClusterLost`: the worker fails what is in
flight and the serve ends (a cluster with a rank missing cannot compute anything).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import mlx.core as mx

from mlxlaunch.engine.runtime.rank_group import RankGroup
from mlxlaunch.engine.scheduling import cluster_ops as ops
from mlxlaunch.engine.scheduling.job import Job

log = logging.getLogger(__name__)

# An idle rank 0 checks on the others this often (seconds): a rank that died while nothing
# ran is noticed within a beat, not at the next request.
BEAT_S = 2.0

Sampler = Callable[[mx.array], mx.array]


class Lockstep:
    """The leader's channel to the followers (rank 0 of `group`)."""

    def __init__(self, group: RankGroup, clock: Callable[[], float] = time.monotonic) -> None:
        assert group.leads, "only rank 0 leads"
        self.group = group
        self._clock = clock
        self._last_sent = clock()
        self.broken: BaseException | None = None  # set once a rank is lost
        self._raw_logits: list[mx.array] = []  # this step's, seen by `watch_logits`

    def _send(self, op: ops.Op) -> None:
        self.group.share(op)
        self._last_sent = self._clock()

    def load(self) -> None:
        self._send(ops.Load())

    def unload(self) -> None:
        self._send(ops.Unload())

    def insert(self, op: ops.Insert) -> None:
        self._send(op)

    def agree(self, held: int) -> int:
        """The cached-prefix length every rank holds (see PromptCaches.cache_for)."""
        return self.group.agree_min(held)

    def step(self, prefill_tokens: int) -> None:
        self._send(ops.Step(prefill_tokens))

    def remove(self, uids: list[int]) -> None:
        self._send(ops.Remove(tuple(uids)))

    def save(self, one_step: bool) -> None:
        self._send(ops.SavePrefixes(one_step))

    def beat_due(self) -> float:
        """Seconds until the next idle beat is due (0: now)."""
        return max(0.0, BEAT_S - (self._clock() - self._last_sent))

    def beat(self) -> None:
        self._send(ops.Beat())

    def stop(self) -> None:
        """Tell the followers to exit (nothing more if a rank is already gone)."""
        if self.broken is not None:
            return
        try:
            self._send(ops.Stop())
        except Exception as exc:  # they are gone already: nothing left to stop
            log.warning("cluster: could not tell the other ranks to stop: %s", exc)

    def sampler(self, sampler: Sampler) -> Sampler:
        """`sampler` whose choice every rank receives (one collective per call)."""
        group = self.group

        def shared(logprobs: mx.array) -> mx.array:
            raw, self._raw_logits = self._raw_logits, []
            return group.leader_tokens(sampler(logprobs), logprobs, after=raw)

        return shared

    def watch_logits(self, tokens: mx.array, logits: mx.array) -> mx.array:
        """A logits processor, first of a job's: notes the step's raw logits (unchanged), so
        the tokens shared depend on the forward pass however the processors after it decide
        (see RankGroup.leader_tokens)."""
        self._raw_logits.append(logits)
        return logits


def echo_sampler(group: RankGroup) -> Sampler:
    """A follower's sampler: whatever rank 0 sampled (see `Lockstep.sampler`)."""

    def echo(logprobs: mx.array) -> mx.array:
        return group.leader_tokens(None, logprobs)

    return echo


def cluster_insert(job: Job, *, own_sampler: bool) -> ops.Insert:
    """What the other ranks need of a job joining the batch."""
    return ops.Insert(
        prompt=tuple(job.prompt),
        cached_tokens=job.cached_tokens,
        max_tokens=job.max_tokens,
        own_sampler=own_sampler,
        main=job.request.kind == "main",
        pin_s=job.request.pin_prefix_s,
    )
