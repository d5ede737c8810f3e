"""The worker's side of the prefix cache: what each job's prefill starts from, what it leaves.

At admission a job is planned against the cache (`plan`): the reused prefix is fetched then, so
what `Admitted` reports is exactly where its prefill starts. At insert the job takes that cache
(`cache_for`); when it finishes or leaves the batch, its KV is kept (`retain`). On a cluster
every rank keeps its own shard of the same prefixes, and the ranks agree on how many prompt
tokens come from the cache before the batch takes the job (`agree`, engine/cluster/).

Runs on the worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mlxlaunch.engine.cache.misses import CacheReuse
from mlxlaunch.engine.cache.prefix import PrefixCache, cache_settings
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.runtime.loader import LoadedModel
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, new_caches
from mlxlaunch.engine.scheduling.job import Job
from mlxlaunch.engine.scheduling.retention import retain_job
from mlxlaunch.engine.stats import StatsBook

# How a cluster settles a job's cached prefix: (this rank's count) -> the count all ranks hold.
Agreement = Callable[[int], int]


class PromptCaches:
    """The prefix cache of the loaded model (None: disabled or not loaded) and the caches
    planned for admitted jobs until they join the batch."""

    def __init__(self, config: EngineConfig, stats: StatsBook, lock: threading.Lock) -> None:
        self._config = config
        self._stats = stats
        self._tokenizer_lock = lock
        self.prefix: PrefixCache | None = None
        self._planned: dict[Job, list[Any]] = {}  # caches planned at admission, until insert
        self._kv: KVQuantization | None = None  # how the loaded model's caches are held

    def open(self, loaded: LoadedModel) -> PrefixCache | None:
        """Build the loaded model's prefix cache, restoring its recent prefixes from disk."""
        self._kv = loaded.kv
        settings = cache_settings(self._config)
        if settings.memory_bytes <= 0:
            self.prefix = None
            return None
        tokenizer = loaded.tokenizer

        def decode(tokens: list[int]) -> str:
            with self._tokenizer_lock:
                return str(tokenizer.decode(tokens))

        prefix = PrefixCache(loaded.base_model, loaded.info.path, settings, decode, kv=loaded.kv)
        prefix.restore()  # warm start: this model's recent prefixes from disk, before requests
        self.prefix = prefix
        self.publish()
        return prefix

    def close(self) -> None:
        self.prefix = None
        self._planned.clear()

    def plan(self, job: Job) -> tuple[int, CacheReuse]:
        """Prompt tokens already held in a reusable KV cache, and how that compares with what
        the cache held of the prompt; the cache is set aside for the job now."""
        prefix = self.prefix
        if prefix is None:
            return 0, "fresh"
        plan = prefix.plan(job.prompt, request_id=job.request_id, kind=job.request.kind)
        if plan.caches is not None:
            self._planned[job] = plan.caches
        self.publish()
        return plan.cached_tokens, prefix.misses.reuse_of(job.request_id, plan.cached_tokens)

    def cache_for(self, job: Job, model: Any, agree: Agreement | None = None) -> list[Any]:
        """The KV cache the job's prefill continues from (a private copy: the batch may
        write into it). `agree`: a cluster's settlement of `job.cached_tokens`, which may
        lower it (a rank holds less of the prompt); the job's count is updated to match."""
        planned = self._planned.pop(job, None)
        if agree is not None:
            job.cached_tokens, planned = settle(job.cached_tokens, planned, agree)
        if planned is not None:
            return planned
        return new_caches(model, self._kv)

    def forget(self, job: Job) -> None:
        self._planned.pop(job, None)

    def retain(self, job: Job, caches: dict[int, Any]) -> None:
        """Keep a finished or removed job's KV: `{uid: (caches, tokens they hold)}`."""
        retain_job(job, caches, self.prefix)
        if self.prefix is not None:
            self.publish()

    @property
    def snapshots_wanted(self) -> bool:
        """A model whose cache cannot be trimmed is reusable only where a snapshot was taken:
        the end of a prompt (all but its last token) is where the next turn continues, so the
        batch reports each prompt's caches there."""
        return self.prefix is not None and self.prefix.exact

    def save(self, *, one_step: bool) -> None:
        prefix = self.prefix
        if prefix is not None and (prefix.save_step() if one_step else prefix.save_pending()):
            self.publish()

    @property
    def saves_pending(self) -> bool:
        return self.prefix is not None and self.prefix.saves_pending

    def publish(self) -> None:
        if self.prefix is not None:
            self._stats.cache = self.prefix.figures()


def settle(held: int, caches: list[Any] | None, agree: Agreement) -> tuple[int, list[Any] | None]:
    """The count every rank holds and this rank's cache cut to it (None: start fresh).

    Two rounds: the smallest count any rank holds, then whether every rank can cut its cache
    back to that count (a cache that cannot be trimmed, or a cut to nothing, means fresh)."""
    agreed = agree(held if caches is not None else 0)
    if agreed < held and caches is not None:
        cut = held - agreed
        if agreed > 0 and all(c.is_trimmable() for c in caches):
            for cache in caches:
                cache.trim(cut)
        else:
            caches = None
    final = agree(agreed if caches is not None else 0)
    if final < agreed:
        caches = None
    return (final, caches) if caches is not None else (0, None)
