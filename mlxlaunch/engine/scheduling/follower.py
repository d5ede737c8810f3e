"""A rank other than 0: it holds a shard of the model and does what rank 0 says, in order.

It keeps what rank 0's worker keeps of the model — a batch of the same shape and a
prefix cache of its own shard — and applies each shared decision (`ops`) as rank 0's worker
applies it: loads, joins, steps, removals, saves. Where rank 0 reuses a cached prefix, this
rank plans its own from its cache, and the two agree on the shorter (`settle`). What a
sequence does at each step (its prefill progress, its end) follows from the same tokens, so
this rank keeps a finished sequence's KV at the same moment rank 0 does.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

import mlx.core as mx

from mlxlaunch.engine.cache.prefix import PrefixCache
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.sampling import resolve_sampling, sampler_for
from mlxlaunch.engine.runtime import cpu_attention, freed_memory
from mlxlaunch.engine.runtime.loader import LoadedModel, load_model
from mlxlaunch.engine.runtime.quantized_kv import new_caches
from mlxlaunch.engine.runtime.rank_group import RankGroup
from mlxlaunch.engine.scheduling import cluster_ops as ops
from mlxlaunch.engine.scheduling.batch import Batch, make_batch
from mlxlaunch.engine.scheduling.lockstep import echo_sampler
from mlxlaunch.engine.scheduling.prompt_caches import PromptCaches, settle
from mlxlaunch.engine.scheduling.warmup import warm_up_loaded
from mlxlaunch.engine.stats import StatsBook
from mlxlaunch.engine.types import ClusterLost, Sampling

log = logging.getLogger(__name__)

# Exit codes of a follower: 0 when rank 0 said stop, LOST when rank 0 (or another) is gone,
# FAILED when this rank's own work failed.
LOST = 3
FAILED = 1


class _Sequence:
    """What this rank needs to know of a sequence in its batch."""

    def __init__(self, op: ops.Insert, cached_tokens: int) -> None:
        self.prompt_tokens = len(op.prompt)
        self.cached_tokens = cached_tokens
        self.main = op.main
        self.pin_s = op.pin_s


class Follower:
    """Runs rank `config.cluster.group.rank` (> 0) until rank 0 says stop."""

    def __init__(self, config: EngineConfig) -> None:
        assert config.cluster is not None and not config.cluster.group.leads
        self.config = config
        self.group: RankGroup = config.cluster.group
        self.loaded: LoadedModel | None = None
        self._caches = PromptCaches(config, StatsBook(config.clock), threading.Lock())
        self._generator: Batch | None = None
        self._sequences: dict[int, _Sequence] = {}
        self.steps = 0  # steps taken (tests, logs)

    @property
    def prefix(self) -> PrefixCache | None:
        return self._caches.prefix

    def run(self) -> int:
        """Follow rank 0 until it says stop (0) or a rank is lost (LOST)."""
        try:
            while True:
                op = self.group.share()
                if isinstance(op, ops.Stop):
                    self._caches.save(one_step=False)
                    self._close()
                    return 0
                self.apply(op)
        except ClusterLost as exc:
            log.error("rank %d: %s; exiting", self.group.rank, exc)
            return LOST
        except Exception:  # rank 0 fails the same way (a load, a step): it reports it
            log.exception("rank %d failed; exiting", self.group.rank)
            return FAILED

    def apply(self, op: ops.Op) -> None:
        if isinstance(op, ops.Step):
            self._step(op.prefill_tokens)
        elif isinstance(op, ops.Insert):
            self._insert(op)
        elif isinstance(op, ops.Remove):
            self._remove(op.uids)
        elif isinstance(op, ops.Load):
            self._load()
        elif isinstance(op, ops.Unload):
            self._unload()
        elif isinstance(op, ops.SavePrefixes):
            self._caches.save(one_step=op.one_step)
        elif not isinstance(op, ops.Beat):
            log.warning("rank %d: unknown message from rank 0: %r", self.group.rank, op)

    # --- the model ----------------------------------------------------------------------

    def _load(self) -> None:
        if self.loaded is not None:
            return
        loaded = load_model(self.config)  # sharded_load: every rank at once
        self.loaded = loaded
        cpu_attention.install(loaded.base_model)
        self._caches.open(loaded)
        # The same warm-up as rank 0's (same shapes, so the same collectives).
        warm_up_loaded(
            loaded.base_model,
            kv=loaded.kv,
            width=self.config.max_concurrency,
            prefill_chunk=self.config.prefill_chunk,
            sampler=sampler_for(resolve_sampling(Sampling(), loaded.info.sampling_defaults)),
            restored=None,
        )

    def _unload(self) -> None:
        self._caches.save(one_step=False)
        self._close()
        self._caches.close()
        self.loaded = None
        gc.collect()
        mx.clear_cache()
        freed_memory.release()

    def _close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        self._sequences.clear()

    def _batch_generator(self) -> Batch:
        if self._generator is None:
            loaded = self._require_loaded()
            self._generator = make_batch(loaded, self.config, echo_sampler(self.group))
        return self._generator

    def _require_loaded(self) -> LoadedModel:
        if self.loaded is None:  # rank 0 loads before it inserts: never expected
            raise ClusterLost("rank 0 sent work before the model was loaded")
        return self.loaded

    # --- the batch ----------------------------------------------------------------------

    def _insert(self, op: ops.Insert) -> None:
        loaded = self._require_loaded()
        generator = self._batch_generator()
        prompt = list(op.prompt)
        held, caches = 0, None
        prefix = self.prefix
        if prefix is not None:
            plan = prefix.plan(prompt, kind="main" if op.main else "")
            held, caches = plan.cached_tokens, plan.caches
        cached, caches = settle(held, caches, self.group.agree_min)
        if caches is None:
            caches = new_caches(loaded.base_model, loaded.kv)
        # A sampler of its own where rank 0's job has one: the batch then samples row by row
        # on both ranks, one collective per row (a fresh function, as rank 0's are distinct).
        sampler: Any = echo_sampler(self.group) if op.own_sampler else None
        uid = generator.insert(
            prompt[cached:],
            max_tokens=op.max_tokens,
            cache=caches,
            held=prompt[:cached],
            sampler=sampler,
            snapshot=self._caches.snapshots_wanted,
            urgent=op.main,
        )
        self._sequences[uid] = _Sequence(op, cached)

    def _step(self, prefill_tokens: int) -> None:
        generator = self._batch_generator()
        prompt_responses, generation_responses = generator.step(prefill_tokens)
        self.steps += 1
        for progress in prompt_responses:
            sequence = self._sequences.get(progress.uid)
            if sequence is not None and progress.snapshot is not None:
                self._retain(sequence, *progress.snapshot)
        for response in generation_responses:
            sequence = self._sequences.get(response.uid)
            if sequence is None or response.finish_reason is None:
                continue
            del self._sequences[response.uid]
            if response.held is not None:
                self._retain(sequence, *response.held)

    def _remove(self, uids: tuple[int, ...]) -> None:
        generator = self._generator
        present = [uid for uid in uids if uid in self._sequences]
        if generator is None or not present:
            return
        removed = generator.remove(present)
        for uid in present:
            sequence = self._sequences.pop(uid)
            if removed and uid in removed:
                held, tokens = removed[uid]
                self._retain(sequence, held, tokens)

    def _retain(self, sequence: _Sequence, held: Any, tokens: Any) -> None:
        prefix = self.prefix
        if prefix is None or not held or not tokens:
            return
        prefix.retain(list(tokens), held, main=sequence.main, pin_s=sequence.pin_s)
