"""Server-sent-event framing as pure functions: `event: <type>\\ndata: <json>\\n\\n`."""

from __future__ import annotations

import json
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
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_frames(text: str) -> list[SseFrame]:
    """Split an SSE body into frames (the reverse of `frame`, tolerant of CRLF and comments)."""
    frames: list[SseFrame] = []
    event: str | None = None
    data_lines: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line == "":
            if event is not None or data_lines:
                frames.append(SseFrame(event, "\n".join(data_lines)))
            event, data_lines = None, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data_lines.append(value)
    if event is not None or data_lines:
        frames.append(SseFrame(event, "\n".join(data_lines)))
    return frames
