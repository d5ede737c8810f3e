"""The recent-speed figures of stats, read from the batch's own counters over windows of many
steps (reading them every step would cost a lock and a copy per token)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlxlaunch.engine.scheduling.batch import Batch, Counters
from mlxlaunch.engine.stats import StatsBook

# Length (seconds) of one window over which the batch's speed counters are read.
MEASURE_WINDOW_S = 0.5


class SpeedWindow:
    """Feeds `stats` the tokens and seconds of prefill and decode, one window at a time."""

    def __init__(self, stats: StatsBook, clock: Callable[[], float]) -> None:
        self._stats = stats
        self._clock = clock
        # (batch, its counters at the window's start, window start)
        self._window: tuple[Batch, Counters, float] | None = None

    def measure(self, generator: Batch) -> None:
        """A step of `generator` begins: start a window, or close one that is long enough."""
        now = self._clock()
        window = self._window
        if window is not None and window[0] is generator and now - window[2] < MEASURE_WINDOW_S:
            return
        self.end()
        self._window = (generator, replace(generator.counters), now)

    def end(self) -> None:
        """Count the open window (the batch goes idle or away)."""
        if self._window is None:
            return
        generator, start, _ = self._window
        self._window = None
        now = generator.counters
        self._stats.step(
            now.prompt_tokens - start.prompt_tokens,
            now.prompt_time - start.prompt_time,
            now.generation_tokens - start.generation_tokens,
            now.decode_time - start.decode_time,
        )
        self._stats.count(
            drafted_tokens=now.drafted_tokens - start.drafted_tokens,
            accepted_tokens=now.accepted_tokens - start.accepted_tokens,
        )
