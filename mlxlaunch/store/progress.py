"""Download progress: a small sink interface and a rich bar for the terminal."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


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


class RichPullProgress:
    """One rich bar for the whole pull: bytes, speed and ETA, with the current file's name."""

    def __init__(self, console: Console | None = None, label: str = "") -> None:
        self._label = label
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def begin(self, total_bytes: int, already_bytes: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(
            self._label, total=total_bytes, completed=already_bytes
        )

    def file(self, name: str, size: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=f"{self._label} {name}".strip())

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)

    def end(self) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=self._label or "done")
        self._progress.stop()
