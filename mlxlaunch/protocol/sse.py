"""Server-sent events as pure functions: framing (`event: <type>\\ndata: <json>\\n\\n`) and
parsing, whole bodies or line by line as a stream arrives.

Every reader of an SSE stream in this project (the dashboard's feed, the bench clients, the
tests) parses with `FrameReader` and its wrappers here, so framing rules live in one place.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


def frame(event_type: str, data: dict[str, Any]) -> bytes:
    """One SSE frame. JSON is compact and on one line, so `data:` never needs splitting."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event_type}\ndata: {payload}\n\n".encode()


def encode_event(event: BaseModel) -> bytes:
    """Frame a stream event model; the SSE event name is the model's `type`."""
    data = event.model_dump(mode="json")
    return frame(str(data["type"]), data)


@dataclass(frozen=True)
class SseFrame:
    """One event: its name (None when unnamed) and its data lines joined with newlines."""

    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


class FrameReader:
    """Frames from lines as they arrive (the reverse of `frame`; CRLF and comments tolerated).

    Feed each line without its line ending to `line()`, which returns a frame when a blank
    line completes one; `end()` returns what a stream cut short left unterminated.
    """

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def line(self, line: str) -> SseFrame | None:
        line = line.removesuffix("\r")
        if line == "":
            return self.end()
        if line.startswith(":"):
            return None  # a comment
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def end(self) -> SseFrame | None:
        """The frame collected so far, if any, and a fresh start."""
        if self._event is None and not self._data:
            return None
        done = SseFrame(self._event, "\n".join(self._data))
        self._event, self._data = None, []
        return done


def iter_frames(lines: Iterable[str]) -> Iterator[SseFrame]:
    """Frames of a stream of lines (e.g. httpx's `iter_lines()`), each as soon as it is whole."""
    reader = FrameReader()
    for line in lines:
        if (done := reader.line(line)) is not None:
            yield done
    if (done := reader.end()) is not None:
        yield done


async def aiter_frames(lines: AsyncIterable[str]) -> AsyncIterator[SseFrame]:
    """`iter_frames` for an async stream of lines (e.g. httpx's `aiter_lines()`)."""
    reader = FrameReader()
    async for line in lines:
        if (done := reader.line(line)) is not None:
            yield done
    if (done := reader.end()) is not None:
        yield done


def parse_frames(text: str) -> list[SseFrame]:
    """Split a whole SSE body into frames."""
    return list(iter_frames(text.replace("\r\n", "\n").split("\n")))
