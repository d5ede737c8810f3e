"""A pull's bar says what is happening now: its speed is that of the last seconds up to the
moment it is drawn, and a pull that stops receiving reads `stalled Ns` with no time left
promised (rich's own columns froze at the last speed and ETA). Sizes read in binary units."""

from __future__ import annotations

import io

from rich.console import Console

from mlxlaunch.store.progress import (
    RATE_WINDOW_S,
    STALL_S,
    BytesColumn,
    RichPullProgress,
    SpeedColumn,
    TimeLeftColumn,
    TransferMeter,
)

MIB = 1024**2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bar(clock: Clock) -> tuple[RichPullProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    return RichPullProgress(console, label="m", clock=clock), out


def _cells(bar: RichPullProgress) -> list[str]:
    progress = bar._progress  # the columns as rich draws them, at this clock's moment
    task = progress.tasks[0]
    return [c.render(task).plain for c in progress.columns[2:]]  # type: ignore[union-attr]


def test_the_speed_is_that_of_the_last_seconds_and_a_stall_shows_as_one() -> None:
    clock = Clock()
    bar, _ = _bar(clock)
    bar.begin(100 * MIB, 0)
    for _ in range(10):
        clock.now += 1.0
        bar.advance(2 * MIB)
    sizes, speed, left = _cells(bar)
    assert sizes == "20.0 MiB/100.0 MiB" and speed == "2.0 MiB/s" and left == "0:00:40"
    clock.now += STALL_S + 7  # the hub stops sending
    sizes, speed, left = _cells(bar)
    assert speed == f"stalled {STALL_S + 7:.0f}s" and left == "-:--:--"
    clock.now += 1.0
    bar.advance(1 * MIB)  # it comes back: a speed again, from what the window saw
    assert not bar.meter.stalled() and _cells(bar)[1] == "102.4 KiB/s"  # 1 MiB in 10 s
    bar.end()


def test_the_meter_forgets_what_is_older_than_its_window() -> None:
    clock = Clock()
    meter = TransferMeter(clock=clock)
    for _ in range(5):
        clock.now += 1.0
        meter.record(MIB)
    assert meter.rate() == MIB  # 5 MiB over the 5 s so far
    clock.now += RATE_WINDOW_S + 1
    assert meter.rate() == 0 and meter.stalled()
    meter.record(-MIB)  # a server that ignored a resume took bytes back: no speed, no byte
    assert meter.rate() == 0 and meter.idle_s() == RATE_WINDOW_S + 1


def test_bytes_from_an_earlier_pull_are_no_speed() -> None:
    clock = Clock()
    bar, _ = _bar(clock)
    clock.now += 60
    bar.begin(10 * MIB, 8 * MIB)  # resumed: 8 MiB were there already
    clock.now += 1
    assert _cells(bar)[0] == "8.0 MiB/10.0 MiB" and _cells(bar)[2] == "-:--:--"
    assert isinstance(bar._progress.columns[2], BytesColumn)
    assert isinstance(bar._progress.columns[3], SpeedColumn)
    assert isinstance(bar._progress.columns[4], TimeLeftColumn)
    bar.end()
