"""Engine statistics: plain-data snapshots for the dashboard and metrics, and their bookkeeping.

The worker thread writes; any thread reads a snapshot through `StatsBook.snapshot`. The server
turns a snapshot into the stats wire type (`protocol/stats.py`) in one function
(`server/stats_snapshot.py`); a field added here must be added there too (tests/test_stats_wire.py).

The speeds in a snapshot (`prefill_tps`, `decode_tps`) are tokens per second of work over the
steps of the last `RATE_WINDOW_S` seconds, by the injected clock at read time: they read 0 once
nothing ran for that long (they used to be pruned only when a step came, so an idle server
showed its last speeds forever). Admission's backlog estimate keeps the last measured prefill
speed instead (`prefill_tps()`): an idle spell does not make the machine any slower.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

EngineState = Literal["unloaded", "loading", "loaded"]

# How far back the "recent" prefill and decode speeds look.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class EngineCounters:
    """Totals since the engine started; they never go down."""

    requests_admitted: int = 0
    requests_refused: int = 0  # every refusal before admission, 429s included
    requests_overloaded: int = 0  # refusals by admission control (HTTP 429)
    requests_cancelled: int = 0
    requests_deduplicated: int = 0  # duplicates served from a running generation
    requests_failed: int = 0
    requests_completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    idle_cache_clears: int = 0  # MLX buffer cache cleared by the idle sweeper
    idle_unloads: int = 0  # model unloaded by the idle sweeper (keep-alive ran out)
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for verification
    accepted_tokens: int = 0  # of those, accepted (each one a decode step saved)


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, as the dashboard lists it."""

    request_id: str
    kind: str
    model_alias: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    decode_tps: float
    outcome: str  # a stop reason, "cancelled" or "failed"
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    cache_key: str = ""  # the client's conversation key, where it sent one
    # Its reuse against what the prefix cache held of its prompt (Admitted.cache_reuse):
    # prefix_hit, partial, fresh; "" where not judged.
    cache_reuse: str = ""


@dataclass(frozen=True)
class SessionRecord:
    """One agent session's turns on this model: the requests that carried one conversation
    key (Claude Code's session id, Codex's `prompt_cache_key`), for the dashboard's sessions.

    A miss is the latest turn that reused clearly less than the cache held of its prompt
    (`partial`), or nothing of it after the session's first turn (`fresh`).
    """

    key: str
    turns: int
    prompt_tokens: int  # all its turns together
    cached_tokens: int  # of those, read from the prefix cache
    last_request_id: str
    last_prompt_tokens: int
    last_cached_tokens: int
    last_ttft_s: float
    miss_turn: int = 0  # the turn (from 1) of the latest miss; 0: none
    miss_request_id: str = ""
    miss_prompt_tokens: int = 0
    miss_cached_tokens: int = 0
    miss_reuse: str = ""  # partial or fresh


# Sessions the stats keep (the most recently active ones): a bound, clients choose keys.
MAX_SESSIONS = 32


def next_session(previous: SessionRecord | None, record: RequestRecord) -> SessionRecord:
    """`previous` (None: a new session) with the turn `record` added; its latest miss is kept
    unless this turn is one."""
    base = previous or SessionRecord(record.cache_key, 0, 0, 0, "", 0, 0, 0.0)
    session = replace(
        base,
        turns=base.turns + 1,
        prompt_tokens=base.prompt_tokens + record.prompt_tokens,
        cached_tokens=base.cached_tokens + record.cached_tokens,
        last_request_id=record.request_id,
        last_prompt_tokens=record.prompt_tokens,
        last_cached_tokens=record.cached_tokens,
        last_ttft_s=record.ttft_s,
    )
    reuse = record.cache_reuse
    if reuse == "partial" or (reuse == "fresh" and session.turns > 1):
        session = replace(
            session,
            miss_turn=session.turns,
            miss_request_id=record.request_id,
            miss_prompt_tokens=record.prompt_tokens,
            miss_cached_tokens=record.cached_tokens,
            miss_reuse=reuse,
        )
    return session


@dataclass(frozen=True)
class MissDigests:
    """Keyed hashes (8 hex digits) of the token windows on each side of a cache miss.

    Equal digests mean the same tokens, so misses can be told apart or matched (the same
    timestamp breaking every turn) without their text; the key is the process's own, so a
    digest cannot be checked against guessed text elsewhere (engine/cache/misses.py).
    """

    before: str = ""  # the shared tokens just before the divergence
    cached: str = ""  # the earlier sequence's tokens from the divergence on
    request: str = ""  # this request's tokens from the divergence on


@dataclass(frozen=True)
class MissExcerpts:
    """The text of those windows: a client's own words, kept only under `--debug-cache`."""

    before: str = ""
    cached: str = ""
    request: str = ""


@dataclass(frozen=True)
class MissRecord:
    """Why a request missed the prefix cache (engine/cache/misses.py), as stats carry it:
    positions and digests always, prompt text only when the engine was started to keep it."""

    request_id: str
    kind: str
    position: int  # first token index where the request and the nearest sequence differ
    request_tokens: int
    nearest_tokens: int  # length of the nearest earlier sequence the cache held (prompt + output)
    cached_tokens: int  # what the request did reuse
    digests: MissDigests = field(default_factory=MissDigests)
    excerpts: MissExcerpts | None = None  # None unless EngineConfig.debug_cache


@dataclass(frozen=True)
class CacheFigures:
    """The prefix cache as stats report it."""

    bytes: int = 0
    budget_bytes: int = 0
    blocks: int = 0
    evictions: int = 0
    lookups: int = 0
    hits: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    disk_loads: int = 0
    disk_saves: int = 0
    disk_rejected: int = 0
    warning: str | None = None
    last_miss: MissRecord | None = None


@dataclass(frozen=True)
class EngineStats:
    """A point-in-time view of the engine."""

    model: str | None
    state: EngineState
    queue_depth: int
    running: int
    counters: EngineCounters
    prefill_tps: float  # prompt tokens per second over the last few seconds
    decode_tps: float  # generated tokens per second (all sequences together), same window
    memory_active_bytes: int
    memory_cache_bytes: int
    recent: list[RequestRecord] = field(default_factory=list)
    memory_limit_bytes: int = 0  # MLX memory limit the engine set (0: not set)
    queued_tokens: int = 0  # prompt tokens waiting in the admission queue
    cache_hit_ratio: float = 0.0  # share of prompt tokens served from the prefix cache
    cache: CacheFigures = field(default_factory=CacheFigures)
    kv_cache_bytes: int = 0  # KV held: the prefix cache's (cache.bytes) and kv_running_bytes
    kv_running_bytes: int = 0  # KV the running sequences' caches hold (prefilling, decoding)
    kv_bits: int = 16  # how the KV caches are held (16: the model's own precision)
    # Several models (engine/models.py): this one's part, and every model's own stats.
    role: str = "main"  # "main", "small" (Claude Code's haiku tier) or "extra"
    listed_as: str | None = None  # the id the server lists it under (None: the server's)
    failure: str | None = None  # why it could not be loaded (its requests go to the main one)
    models: tuple[EngineStats, ...] = ()  # every served model, the main one first; () : one
    sessions: tuple[SessionRecord, ...] = ()  # the latest active first (at most MAX_SESSIONS)


class StatsBook:
    """Thread-safe accumulator behind `Engine.stats()`."""

    def __init__(
        self,
        clock: Callable[[], float],
        keep_records: int = 50,
        rate_window_s: float = RATE_WINDOW_S,
    ) -> None:
        self._clock = clock
        self.rate_window_s = rate_window_s
        self._lock = threading.Lock()
        self._counters = EngineCounters()
        self._records: deque[RequestRecord] = deque(maxlen=keep_records)
        self._sessions: dict[str, SessionRecord] = {}  # in order of their latest turn
        # (time, prompt tokens, prompt seconds, generated tokens, decode seconds) per step
        self._steps: deque[tuple[float, int, float, int, float]] = deque()
        self._prefill_tps = 0.0  # as last measured; survives idle spells
        self.model: str | None = None
        self.state: EngineState = "unloaded"
        self.queue_depth = 0
        self.running = 0
        self.memory_active_bytes = 0
        self.memory_cache_bytes = 0
        self.memory_limit_bytes = 0
        self.queued_tokens = 0
        self.cache = CacheFigures()  # replaced whole by the worker thread
        self.kv_running_bytes = 0
        self.kv_bits = 16

    def count(self, **deltas: int) -> None:
        """Add to counters, e.g. `count(requests_admitted=1, prompt_tokens=120)`."""
        with self._lock:
            current = self._counters
            self._counters = replace(
                current, **{k: getattr(current, k) + v for k, v in deltas.items()}
            )

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)
            if record.cache_key:
                sessions = self._sessions
                sessions[record.cache_key] = next_session(
                    sessions.pop(record.cache_key, None), record
                )
                if len(sessions) > MAX_SESSIONS:
                    del sessions[next(iter(sessions))]

    def step(self, prompt_tokens: int, prompt_s: float, gen_tokens: int, decode_s: float) -> None:
        """Account one generator step for the recent speeds."""
        now = self._clock()
        with self._lock:
            self._steps.append((now, prompt_tokens, prompt_s, gen_tokens, decode_s))
            steps = self._recent_steps(now)
        prompt_s_total = sum(s[2] for s in steps)
        if prompt_s_total > 0:
            self._prefill_tps = sum(s[1] for s in steps) / prompt_s_total

    def _recent_steps(self, now: float) -> list[tuple[float, int, float, int, float]]:
        """Drop the steps older than the window; the rest (call with the lock held)."""
        while self._steps and self._steps[0][0] < now - self.rate_window_s:
            self._steps.popleft()
        return list(self._steps)

    def prefill_tps(self) -> float:
        """The prefill speed as last measured, kept through idle spells: what admission
        control needs per request (a backlog estimate), without the cost of a snapshot."""
        return self._prefill_tps

    def snapshot(self) -> EngineStats:
        """The engine now; its speeds cover only the steps of the last `rate_window_s`."""
        now = self._clock()
        with self._lock:
            steps = self._recent_steps(now)
            counters = self._counters
            records = list(self._records)
            sessions = tuple(reversed(self._sessions.values()))
        prompt_tokens = sum(s[1] for s in steps)
        prompt_s = sum(s[2] for s in steps)
        gen_tokens = sum(s[3] for s in steps)
        decode_s = sum(s[4] for s in steps)
        return EngineStats(
            model=self.model,
            state=self.state,
            queue_depth=self.queue_depth,
            running=self.running,
            counters=counters,
            prefill_tps=prompt_tokens / prompt_s if prompt_s > 0 else 0.0,
            decode_tps=gen_tokens / decode_s if decode_s > 0 else 0.0,
            memory_active_bytes=self.memory_active_bytes,
            memory_cache_bytes=self.memory_cache_bytes,
            recent=records,
            memory_limit_bytes=self.memory_limit_bytes,
            queued_tokens=self.queued_tokens,
            cache_hit_ratio=counters.cached_tokens / counters.prompt_tokens
            if counters.prompt_tokens
            else 0.0,
            cache=self.cache,
            kv_cache_bytes=self.cache.bytes + self.kv_running_bytes,
            kv_running_bytes=self.kv_running_bytes,
            kv_bits=self.kv_bits,
            sessions=sessions,
        )
