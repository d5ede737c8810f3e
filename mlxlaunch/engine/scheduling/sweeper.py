"""The idle sweeper: give memory back when nobody is asking for work.

After `idle_clear_s` without requests the MLX buffer cache is cleared; after `keep_alive_s`
the model itself is unloaded (the next request loads it again). The sweeper only decides; the
worker thread acts, between steps and never while a load or a request is in progress, since
loads and requests run on that same thread and "a request" here spans its whole life, from
the moment `submit` is called (before rendering) until its iterator is closed.

Durations are parsed in `mlxlaunch.engine.settings` (free of MLX, for the CLI).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

SweepAction = Literal["clear", "unload"]


class IdleSweeper:
    """Tracks request activity and says when the cache clear or the unload is due.

    `begin`/`end` may be called from any thread; `due`/`done` from the worker thread.
    """

    def __init__(
        self,
        idle_clear_s: float | None,
        keep_alive_s: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.idle_clear_s = idle_clear_s
        self.keep_alive_s = keep_alive_s
        self._clock = clock
        self._lock = threading.Lock()
        self._active = 0
        self._last_activity = clock()
        self._cleared = False  # the cache was cleared in the current idle period

    def begin(self) -> None:
        """A request started (it may need the model from now on)."""
        with self._lock:
            self._active += 1
            self._last_activity = self._clock()
            self._cleared = False

    def end(self) -> None:
        """A request ended; the idle period starts now if it was the last one."""
        with self._lock:
            self._active = max(0, self._active - 1)
            self._last_activity = self._clock()
            self._cleared = False

    @property
    def active(self) -> int:
        """Requests between `begin` and `end`."""
        with self._lock:
            return self._active

    def due(self, *, loaded: bool, busy: bool) -> SweepAction | None:
        """What to do now, if anything. `busy`: the worker holds queued or running jobs."""
        if busy:
            return None
        with self._lock:
            if self._active:
                return None
            idle = self._clock() - self._last_activity
            keep_alive = self.keep_alive_s
            if loaded and keep_alive is not None and idle >= keep_alive:
                return "unload"
            clear_after = self.idle_clear_s
            if loaded and not self._cleared and clear_after is not None and idle >= clear_after:
                return "clear"
            return None

    def done(self, action: SweepAction) -> None:
        """Record that `action` happened, so it is not repeated in this idle period."""
        with self._lock:
            self._cleared = True  # an unload releases the cache too
