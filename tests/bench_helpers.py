"""Helpers for the bench's tests."""

from __future__ import annotations

from mlxlaunch.bench.progress import SilentProgress


class CountingProgress(SilentProgress):
    """A ProgressSink that counts the steps done, so a test can check a phase's bar fills."""

    def __init__(self) -> None:
        self.steps = 0

    def advance(self) -> None:
        self.steps += 1
