"""A deadline for the request head, which uvicorn does not have.

uvicorn (h11) bounds the *size* of a request head (`h11_max_incomplete_event_size`) but not
the *time* it may take to arrive: a client that opens connections and trickles header bytes
("slowloris") would hold them open forever. This protocol closes a connection that has not
delivered a complete request head within `header_timeout_s` of connecting (or, on a kept-alive
connection, of the first byte of the next request: that byte cancels uvicorn's own keep-alive
timer, and nothing else would bound the wait).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request head."""

    header_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a next request on a kept-alive connection start its deadline
        # (an idle kept-alive connection is uvicorn's keep-alive timer's business).
        if self._idle() and self._head_deadline is None:
            self._arm_head_deadline()
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._idle():
            self._disarm_head_deadline()  # a request head arrived and is being served

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()


def head_deadline_protocol(header_timeout_s: float) -> type[HeadDeadlineProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` with this request-head deadline."""
    return type(
        "HeadDeadlineProtocol",
        (HeadDeadlineProtocol,),
        {"header_timeout_s": header_timeout_s},
    )
