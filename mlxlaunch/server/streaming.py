"""Reading the engine's event iterator with deadlines, so handlers can send heartbeats.

`EventPump.next(timeout)` waits for the next engine event without cancelling the pending read
when the deadline passes (cancelling it would cancel the request inside the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

import anyio

from mlxlaunch.engine.types import EngineEvent


class _End:
    """Marks the end of the engine's iterator (StopAsyncIteration cannot cross a Task)."""


END: Final = _End()


class EventPump:
    """Pulls events from one engine request's iterator, one pending read at a time."""

    def __init__(self, events: AsyncIterator[EngineEvent]) -> None:
        self._events = events
        self._pending: asyncio.Task[EngineEvent | _End] | None = None
        self.ended = False

    async def next(self, timeout: float | None) -> EngineEvent | _End | None:
        """The next event, `END` when the iterator is exhausted, or None if `timeout` seconds
        passed first (the read stays pending for the next call). Engine errors propagate."""
        if self._pending is None:
            self._pending = asyncio.create_task(self._read())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        task, self._pending = self._pending, None
        result = task.result()
        if isinstance(result, _End):
            self.ended = True
        return result

    async def _read(self) -> EngineEvent | _End:
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            return END

    async def aclose(self) -> None:
        """Stop reading and close the engine iterator; safe to call while being cancelled."""
        with anyio.CancelScope(shield=True):
            pending, self._pending = self._pending, None
            if pending is not None:
                pending.cancel()
                await asyncio.wait({pending})
                if not pending.cancelled():
                    pending.exception()  # consumed so asyncio does not log it
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
