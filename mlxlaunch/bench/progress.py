"""Where a bench run reports its progress: the protocol every phase calls, and a sink that shows
nothing. A leaf module, so the workloads (codex_session) and the runner that drives them both
import it without importing each other.
"""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    """Where a run reports its progress (the CLI draws a bar; tests pass `SilentProgress`)."""

    def begin(self, description: str, steps: int) -> None: ...

    def advance(self) -> None: ...


class SilentProgress:
    """A ProgressSink that shows nothing."""

    def begin(self, description: str, steps: int) -> None:
        """Start a phase of `steps` steps."""

    def advance(self) -> None:
        """One step done."""
