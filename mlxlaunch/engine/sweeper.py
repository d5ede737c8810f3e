"""The idle sweeper: give memory back when nobody is asking for work.

After `idle_clear_s` without requests the MLX buffer cache is cleared; after `keep_alive_s`
the model itself is unloaded (the next request loads it again). The sweeper only decides; the
worker thread acts, between steps and never while a load or a request is in progress, since
loads and requests run on that same thread and "a request" here spans its whole life, from
the moment `submit` is called (before rendering) until its iterator is closed.

This module imports nothing heavy: the CLI uses `parse_duration` to validate flags.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Literal

SweepAction = Literal["clear", "unload"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_FOREVER = {"never", "forever", "always", "inf", "-1", "none"}


def parse_duration(text: str | None) -> float | None:
    """Seconds for a duration like `30m`, `90s`, `1.5h`, `2d` or `45`; None for "never".

    `never` (also `forever`, `-1`, or no value) means keep loaded; `0` means unload as soon as
    the engine is idle. Raises ValueError for anything else.
    """
    if text is None or text.strip().lower() in _FOREVER:
        return None
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r} (use e.g. 30s, 30m, 2h, 0 for at once, never to keep)"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text!r}")
    return seconds


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
