"""Engine statistics: plain-data snapshots for the dashboard and metrics, and their bookkeeping.

The worker thread writes; any thread reads a snapshot through `StatsBook.snapshot`.
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
    requests_refused: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0


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


class StatsBook:
    """Thread-safe accumulator behind `Engine.stats()`."""

    def __init__(self, clock: Callable[[], float], keep_records: int = 50) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counters = EngineCounters()
        self._records: deque[RequestRecord] = deque(maxlen=keep_records)
        # (time, prompt tokens, prompt seconds, generated tokens, decode seconds) per step
        self._steps: deque[tuple[float, int, float, int, float]] = deque()
        self.model: str | None = None
        self.state: EngineState = "unloaded"
        self.queue_depth = 0
        self.running = 0
        self.memory_active_bytes = 0
        self.memory_cache_bytes = 0

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

    def step(self, prompt_tokens: int, prompt_s: float, gen_tokens: int, decode_s: float) -> None:
        """Account one generator step for the recent speeds."""
        now = self._clock()
        with self._lock:
            self._steps.append((now, prompt_tokens, prompt_s, gen_tokens, decode_s))
            while self._steps and self._steps[0][0] < now - RATE_WINDOW_S:
                self._steps.popleft()

    def snapshot(self) -> EngineStats:
        with self._lock:
            steps = list(self._steps)
            counters = self._counters
            records = list(self._records)
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
        )
