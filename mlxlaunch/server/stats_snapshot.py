"""The engine's stats as the stats wire type: the one place `EngineStats` becomes a
`StatsSnapshot`, read by `GET /v1/stats`, its stream and `GET /metrics` alike.

The engine room knows nothing of wire types (DESIGN.md), so the mapping lives here, field by
field: a field added on either side without the other fails tests/test_stats_wire.py. Two
things are left out on purpose: the model's filesystem path (clients see the name they may
send back, as /v1/models lists it) and other clients' prompt text in cache-miss excerpts. The
excerpts pass only when both ends agree to it: the engine kept them (`EngineConfig.debug_cache`)
and the server shares them (`ServerSettings.stats_prompt_excerpts`); `--debug-cache` sets both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxlaunch.engine.stats import CacheFigures as EngineCacheFigures
from mlxlaunch.engine.stats import EngineStats
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.protocol.stats import (
    STATS_VERSION,
    AgentSession,
    CacheFigures,
    CacheMiss,
    MemoryFigures,
    MissDigests,
    MissExcerpts,
    ModelStatus,
    RecentRequest,
    RequestCounters,
    StatsSnapshot,
)


def stats_snapshot(
    stats: EngineStats,
    *,
    now: float,
    started_at: float,
    model_id: str | None = None,
    excerpts: bool = False,
) -> StatsSnapshot:
    """The wire snapshot of `stats`.

    Args:
        now: wall clock for `time` and `uptime_s`.
        started_at: when the server started (wall clock).
        model_id: the name the server lists the model under (None: the path's last part).
        excerpts: include the prompt text around a cache miss (other clients' words) when
            the engine kept it.
    """
    c, cache = stats.counters, stats.cache
    name = None if stats.model is None else model_id or plain_model_id(stats.model)
    return StatsSnapshot(
        version=STATS_VERSION,
        time=now,
        uptime_s=max(0.0, now - started_at),
        model=ModelStatus(name=name, state=stats.state),
        queue_depth=stats.queue_depth,
        queued_tokens=stats.queued_tokens,
        running=stats.running,
        prefill_tps=stats.prefill_tps,
        decode_tps=stats.decode_tps,
        memory=MemoryFigures(
            active_bytes=stats.memory_active_bytes,
            cache_bytes=stats.memory_cache_bytes,
            limit_bytes=stats.memory_limit_bytes,
            kv_cache_bytes=stats.kv_cache_bytes,
            kv_running_bytes=stats.kv_running_bytes,
            kv_bits=stats.kv_bits,
        ),
        counters=RequestCounters.model_validate(c, from_attributes=True),
        cache=CacheFigures(
            hit_ratio=stats.cache_hit_ratio,
            bytes=cache.bytes,
            budget_bytes=cache.budget_bytes,
            blocks=cache.blocks,
            evictions=cache.evictions,
            lookups=cache.lookups,
            hits=cache.hits,
            disk_bytes=cache.disk_bytes,
            disk_entries=cache.disk_entries,
            disk_loads=cache.disk_loads,
            disk_saves=cache.disk_saves,
            disk_rejected=cache.disk_rejected,
            warning=cache.warning,
            last_miss=_last_miss(cache, excerpts),
        ),
        recent=tuple(RecentRequest.model_validate(r, from_attributes=True) for r in stats.recent),
        sessions=tuple(
            AgentSession.model_validate(s, from_attributes=True) for s in stats.sessions
        ),
        role=stats.role,
        failure=stats.failure,
        models=tuple(
            stats_snapshot(
                each,
                now=now,
                started_at=started_at,
                model_id=model_id if each.role == "main" else each.listed_as,
                excerpts=excerpts,
            )
            for each in stats.models
        ),
    )


def _last_miss(cache: EngineCacheFigures, excerpts: bool) -> CacheMiss | None:
    report = cache.last_miss
    if report is None:
        return None
    text = report.excerpts if excerpts else None
    return CacheMiss(
        request_id=report.request_id,
        kind=report.kind,
        position=report.position,
        request_tokens=report.request_tokens,
        nearest_tokens=report.nearest_tokens,
        cached_tokens=report.cached_tokens,
        digests=MissDigests(
            before=report.digests.before,
            cached=report.digests.cached,
            request=report.digests.request,
        ),
        excerpts=None
        if text is None
        else MissExcerpts(before=text.before, cached=text.cached, request=text.request),
    )


class StatsReader:
    """Snapshots of one engine for the stats routes and the metrics collector.

    Args:
        engine: anything with `stats()` (the engine); without one, `read()` returns None.
        model_id: the name the server lists the model under (see `stats_snapshot`).
        excerpts: include cache-miss prompt excerpts (see `stats_snapshot`).
        clock: wall clock for `time` and `uptime_s`; uptime counts from this reader's creation.
    """

    def __init__(
        self,
        engine: object,
        *,
        model_id: str | None = None,
        excerpts: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.model_id = model_id
        self.excerpts = excerpts
        self.clock = clock
        self.started_at = clock()

    def read(self) -> StatsSnapshot | None:
        """The engine now, or None when it does not report stats."""
        stats = getattr(self.engine, "stats", None)
        if not callable(stats):
            return None
        current = stats()
        if not isinstance(current, EngineStats):
            raise TypeError(f"engine.stats() returned {type(current).__name__}, not EngineStats")
        return stats_snapshot(
            current,
            now=self.clock(),
            started_at=self.started_at,
            model_id=self.model_id,
            excerpts=self.excerpts,
        )
