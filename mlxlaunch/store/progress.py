"""Download progress: a small sink interface and a rich bar for the terminal.

The bar's speed and time left are measured here, over the last few seconds up to the moment
the bar is drawn (`TransferMeter`), not from the last chunk that arrived: rich's own columns
keep showing the last speed and ETA while no byte comes, so a stalled pull looked alive. Now
a stall reads as one, `stalled 12s`, with no time left promised.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID, TextColumn
from rich.text import Text

from mlxlaunch.units import format_bytes, format_rate

# The speed is the bytes of the last RATE_WINDOW_S seconds; no byte for STALL_S is a stall.
RATE_WINDOW_S = 10.0
STALL_S = 5.0


class PullProgress(Protocol):
    """Receives a pull's progress; implementations must be cheap (called per chunk)."""

    def begin(self, total_bytes: int, already_bytes: int) -> None:
        """The pull starts: `total_bytes` in all, `already_bytes` of them present from before."""

    def file(self, name: str, size: int) -> None:
        """Downloading of `name` starts."""

    def advance(self, n: int) -> None:
        """`n` more bytes arrived (negative when a server ignored a resume and restarted)."""

    def end(self) -> None:
        """The pull finished or stopped."""


class SilentProgress:
    """Counts bytes and files, shows nothing (for scripts and tests)."""

    def __init__(self) -> None:
        self.total = 0
        self.already = 0
        self.received = 0
        self.files: list[str] = []
        self.ended = False

    def begin(self, total_bytes: int, already_bytes: int) -> None:
        self.total, self.already = total_bytes, already_bytes

    def file(self, name: str, size: int) -> None:
        self.files.append(name)

    def advance(self, n: int) -> None:
        self.received += n

    def end(self) -> None:
        self.ended = True


class TransferMeter:
    """Bytes per second over the last `window_s` seconds, as of whenever it is asked."""

    def __init__(
        self, *, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[float, int]] = deque()
        self.restart()

    def restart(self) -> None:
        """Measure from now on (a pull begins: bytes already present are no speed)."""
        self.started = self.last_byte = self.clock()
        self._samples.clear()

    def record(self, n: int) -> None:
        """`n` bytes arrived now (negative: a restart took bytes back, which is no speed)."""
        now = self.clock()
        if n > 0:
            self._samples.append((now, n))
            self.last_byte = now
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        """Bytes per second over the window that ends now (over the time so far, if shorter)."""
        now = self.clock()
        self._forget(now)
        span = min(self.window_s, max(now - self.started, 1e-9))
        return sum(n for _, n in self._samples) / span

    def idle_s(self) -> float:
        """Seconds since the last byte (since the start, before the first)."""
        return max(0.0, self.clock() - self.last_byte)

    def stalled(self) -> bool:
        """True when no byte has come for `STALL_S` seconds."""
        return self.idle_s() >= STALL_S


class BytesColumn(ProgressColumn):
    """`1.2 GiB/4.0 GiB`: done and total, in the one size format."""

    def render(self, task: Any) -> Text:
        total = format_bytes(task.total) if task.total is not None else "?"
        return Text(f"{format_bytes(task.completed)}/{total}", style="progress.download")


class _MeterColumn(ProgressColumn):
    """A column drawn from the transfer meter rather than from the task's own figures."""

    def __init__(self, meter: TransferMeter) -> None:
        super().__init__()
        self.meter = meter


class SpeedColumn(_MeterColumn):
    """The meter's speed now, or `stalled Ns` when nothing has come for a while."""

    def render(self, task: Any) -> Text:
        if task.finished:
            return Text("")
        if self.meter.stalled():
            return Text(f"stalled {self.meter.idle_s():.0f}s", style="yellow")
        return Text(format_rate(self.meter.rate()), style="progress.data.speed")


class TimeLeftColumn(_MeterColumn):
    """Time left at the meter's speed now: `-:--:--` while stalled, `0:00:00` when done."""

    def render(self, task: Any) -> Text:
        if task.finished:
            return Text("0:00:00", style="progress.remaining")
        rate = self.meter.rate()
        if task.total is None or rate <= 0 or self.meter.stalled():
            return Text("-:--:--", style="progress.remaining")
        seconds = int(max(0.0, task.total - task.completed) / rate)
        hours, rest = divmod(seconds, 3600)
        return Text(f"{hours}:{rest // 60:02d}:{rest % 60:02d}", style="progress.remaining")


class RichPullProgress:
    """One rich bar for the whole pull: bytes, speed and ETA, with the current file's name."""

    def __init__(
        self,
        console: Console | None = None,
        label: str = "",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label = label
        self.meter = TransferMeter(clock=clock)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            BytesColumn(),
            SpeedColumn(self.meter),
            TimeLeftColumn(self.meter),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def begin(self, total_bytes: int, already_bytes: int) -> None:
        self.meter.restart()
        self._progress.start()
        self._task = self._progress.add_task(
            self._label, total=total_bytes, completed=already_bytes
        )

    def file(self, name: str, size: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=f"{self._label} {name}".strip())

    def advance(self, n: int) -> None:
        self.meter.record(n)
        if self._task is not None:
            self._progress.advance(self._task, n)

    def end(self) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=self._label or "done")
        self._progress.stop()
