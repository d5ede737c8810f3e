"""Duplicate requests share one generation.

When Claude Code times out it sends the very same request again while the first is still
being computed. Computing it twice would halve everyone's speed for nothing, so a request
whose rendered prompt and generation settings equal those of a running one subscribes to
that generation instead: it gets the events produced so far (a replay) and then the live
ones. A subscriber leaving does not stop the generation while others still listen; the last
one leaving cancels it.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields

from mlxlaunch.engine.scheduling.job import EventSink, Job, SinkItem
from mlxlaunch.engine.types import Done, GenerationRequest

# Request fields that do not change what is generated: the messages are in the rendered
# tokens, and ids and labels are bookkeeping.
_NOT_IN_KEY = frozenset(
    {
        "messages",
        "request_id",
        "kind",
        "model_alias",
        "cache_key",
        "schema_field",
        "tool_schema_field",
    }
)
_KEYED_FIELDS = tuple(f.name for f in fields(GenerationRequest) if f.name not in _NOT_IN_KEY)


def generation_key(tokens: Sequence[int], request: GenerationRequest, max_tokens: int) -> str:
    """A digest of everything that determines a generation's output.

    It runs on every admission, so it stays cheap: the prompt is hashed as raw token bytes,
    and the settings through `repr` of the request's own fields (frozen dataclasses, lists
    and dicts of plain values), with no deep copy or JSON of the conversation. Two requests
    built from the same JSON body repr the same; a difference only in dict key order merely
    misses a share.
    """
    settings = tuple(getattr(request, name) for name in _KEYED_FIELDS)
    # The settings' repr is self-delimiting (a tuple), so settings then tokens can't blur.
    digest = hashlib.sha256(repr((max_tokens, settings)).encode())
    digest.update(array("q", tokens).tobytes())
    return digest.hexdigest()


def deliver(sink: EventSink, item: SinkItem) -> None:
    """Send `item` to this one sink only (a SharedSink would fan it out to everyone)."""
    EventSink.send(sink, item)


def _ends(item: SinkItem) -> bool:
    return isinstance(item, BaseException) or any(isinstance(e, Done) for e in item)


class SharedSink(EventSink):
    """The first requester's sink, which also fans every item out to later subscribers.

    It keeps what it has sent so a subscriber that joins late gets a full replay. Items go
    out in order: replay and live sends happen under one lock.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, owner_id: str) -> None:
        super().__init__(loop)
        self._lock = threading.Lock()
        self._history: list[SinkItem] = []
        self._subscribers: dict[str, EventSink] = {owner_id: self}
        self.closed = False  # Done or an error went out: nothing more will come

    def send(self, item: SinkItem) -> None:
        with self._lock:
            if self.closed:
                return
            self._history.append(item)
            self.closed = _ends(item)
            for sink in self._subscribers.values():
                if sink is self:
                    super().send(item)
                else:
                    sink.send(item)

    def subscribe(self, request_id: str, loop: asyncio.AbstractEventLoop) -> EventSink | None:
        """A new sink primed with everything sent so far, or None if the generation ended."""
        with self._lock:
            if self.closed:
                return None
            sink = EventSink(loop)
            for item in self._history:
                sink.send(item)
            self._subscribers[request_id] = sink
            return sink

    @property
    def listeners(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def unsubscribe(self, request_id: str) -> tuple[EventSink | None, int]:
        """Stop sending to `request_id`; its sink (if it had one) and how many remain."""
        with self._lock:
            sink = self._subscribers.pop(request_id, None)
            return sink, len(self._subscribers)


@dataclass
class _Generation:
    key: str | None
    job: Job
    sink: SharedSink


class DuplicateRegistry:
    """Running generations by key, and which generation each request id listens to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, _Generation] = {}
        self._by_request: dict[str, _Generation] = {}

    def register(self, key: str | None, request_id: str, job: Job, sink: SharedSink) -> None:
        """A new generation, owned by `request_id` (key None: never shared)."""
        generation = _Generation(key, job, sink)
        with self._lock:
            if key is not None:
                self._by_key[key] = generation
            self._by_request[request_id] = generation

    def attach(
        self, key: str, request_id: str, loop: asyncio.AbstractEventLoop
    ) -> EventSink | None:
        """Subscribe `request_id` to the running generation with `key`, if there is one."""
        with self._lock:
            generation = self._by_key.get(key)
            if generation is None:
                return None
            sink = generation.sink.subscribe(request_id, loop)
            if sink is None:  # it ended; a new request computes afresh
                del self._by_key[key]
                return None
            self._by_request[request_id] = generation
            return sink

    def leave(self, request_id: str) -> tuple[Job | None, EventSink | None]:
        """Unsubscribe `request_id`.

        Returns the job when it was the last listener (the caller cancels it if unfinished),
        else None, and the request's own sink (None if unknown).
        """
        with self._lock:
            generation = self._by_request.pop(request_id, None)
            if generation is None:
                return None, None
            sink, remaining = generation.sink.unsubscribe(request_id)
            if remaining:
                return None, sink
            if generation.key is not None and self._by_key.get(generation.key) is generation:
                del self._by_key[generation.key]
            return generation.job, sink

    def job_of(self, request_id: str) -> Job | None:
        """The job `request_id` listens to (None: unknown or already left)."""
        with self._lock:
            generation = self._by_request.get(request_id)
            return generation.job if generation is not None else None

    def listeners(self, request_id: str) -> int:
        """How many requests listen to the generation `request_id` listens to (0: unknown)."""
        with self._lock:
            generation = self._by_request.get(request_id)
            if generation is None:
                return 0
            return generation.sink.listeners

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)
