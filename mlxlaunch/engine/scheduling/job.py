"""One request's life inside the engine: its prompt, its output stream and its event sink.

A `Job` is created by the async side and then touched only by the worker thread, except for
`finished`, which the async side reads to know whether closing its iterator must cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer, TokenizerWrapper

from mlxlaunch.engine.decoding.drafting import PromptLookup
from mlxlaunch.engine.decoding.plan import NO_PLAN, DecodingPlan
from mlxlaunch.engine.output.parser import ParsedEvent
from mlxlaunch.engine.output.parser_config import ModelOutputParser
from mlxlaunch.engine.stats import RequestRecord
from mlxlaunch.engine.types import (
    EngineEvent,
    GenerationRequest,
    Timings,
    ToolCallEvent,
)

SinkItem = list[EngineEvent] | BaseException


class EventSink:
    """Hands events from the worker thread to the request's asyncio queue.

    Items are lists of events (one list per step, to keep cross-thread calls per token low) or
    an exception that ends the request. Inside `batched_delivery` (the worker's steps), every
    sink's items wait for the block's end and go to each event loop in one call.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[SinkItem] = asyncio.Queue()

    def send(self, item: SinkItem) -> None:
        held: dict[asyncio.AbstractEventLoop, list[Delivery]] | None = getattr(
            _outbox, "held", None
        )
        if held is not None:
            held.setdefault(self.loop, []).append((self.queue, item))
            return
        # A closed loop means the caller is gone; there is nobody to tell.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


Delivery = tuple["asyncio.Queue[SinkItem]", SinkItem]
_outbox = threading.local()


@contextlib.contextmanager
def batched_delivery() -> Iterator[None]:
    """Within the block, sinks on this thread hold their items; at its end each event loop
    gets all of them in one `call_soon_threadsafe` (in the order they were sent).

    Measured on the worker, one stream of the tiny test model: sending each job's events on
    its own cost ~0.6 ms a step of a 2.5 ms step (each call wakes the loop, whose thread
    then contends for the GIL while the worker builds the next step); with four streams,
    four such calls a step."""
    if getattr(_outbox, "held", None) is not None:  # nested: the outer block sends
        yield
        return
    held: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    _outbox.held = held
    try:
        yield
    finally:
        _outbox.held = None
        for loop, deliveries in held.items():
            with contextlib.suppress(RuntimeError):  # that caller's loop is gone
                loop.call_soon_threadsafe(_deliver_all, deliveries)


def _deliver_all(deliveries: list[Delivery]) -> None:
    for queue, item in deliveries:
        queue.put_nowait(item)


class OutputStream:
    """Tokens in, parsed events out: streaming detokenization then the output parser.

    The detokenizer holds back incomplete UTF-8 sequences, so a multi-byte character split
    over tokens reaches the parser whole.
    """

    def __init__(
        self, tokenizer: TokenizerWrapper, parser: ModelOutputParser, lock: threading.Lock
    ) -> None:
        self.detokenizer = tokenizer.detokenizer  # a fresh copy per request
        self.parser = parser
        # Only the naive detokenizer calls back into the tokenizer (decode), which needs the lock.
        naive = isinstance(self.detokenizer, NaiveStreamingDetokenizer)
        self._lock: Any = lock if naive else contextlib.nullcontext()
        self.tool_calls = 0

    def push(self, token: int) -> list[ParsedEvent]:
        with self._lock:
            self.detokenizer.add_token(token)
            segment = self.detokenizer.last_segment
        return self._count(self.parser.feed(segment)) if segment else []

    def close(self) -> list[ParsedEvent]:
        """Flush held-back text (unless the parser already ended the output)."""
        events: list[ParsedEvent] = []
        if not self.parser.done:
            with self._lock:
                self.detokenizer.finalize()
                # A cut (max_tokens, stop) inside a multi-byte character leaves bytes that decode
                # to U+FFFD: drop that half character rather than send a replacement char.
                segment = self.detokenizer.last_segment.rstrip("\ufffd")
            if segment:
                events.extend(self.parser.feed(segment))
        events.extend(self.parser.finish())
        return self._count(events)

    def _count(self, events: list[ParsedEvent]) -> list[ParsedEvent]:
        self.tool_calls += sum(isinstance(e, ToolCallEvent) for e in events)
        return events


@dataclass(eq=False)
class Job:
    """A request the engine accepted, from queue to Done."""

    request_id: str
    request: GenerationRequest
    prompt: list[int]
    max_tokens: int  # after clamping to the context window
    clamped: bool
    opens_thinking: bool
    sink: EventSink
    submitted_at: float
    decoding: DecodingPlan = NO_PLAN  # constraints and thinking budget, built at submit
    images: tuple[Any, ...] = ()  # a vision model's prepared images: held while it runs
    # Filled in by the worker thread.
    uid: int | None = None
    cached_tokens: int = 0
    cache_reuse: str | None = None  # how the cache served its prompt (Admitted.cache_reuse)
    started_at: float | None = None
    first_token_at: float | None = None
    # Its draft source for speculative decoding (built at submit), None: it does not draft.
    drafter: PromptLookup | None = None
    drafted: int = 0  # tokens drafted for it, and of those accepted
    accepted: int = 0
    shared: bool = False  # on a cluster: the other ranks were told of it (lockstep.py)
    output_tokens: int = 0
    last_progress: int = -1
    output: OutputStream | None = None
    queued: bool = True  # still counted by admission control
    finished: bool = False
    pending: list[EngineEvent] = field(default_factory=list)  # events of the current step

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    def timings(self, now: float) -> Timings:
        """Queue time, time to first token and speeds, as of `now` (the end)."""
        start = self.started_at if self.started_at is not None else now
        first = self.first_token_at
        prefilled = self.prompt_tokens - self.cached_tokens
        prefill_s = (first - start) if first is not None else 0.0
        decode_s = (now - first) if first is not None else 0.0
        return Timings(
            queue_s=max(0.0, start - self.submitted_at),
            ttft_s=(first - self.submitted_at) if first is not None else 0.0,
            prefill_tps=prefilled / prefill_s if prefill_s > 0 else 0.0,
            decode_tps=(self.output_tokens - 1) / decode_s if decode_s > 0 else 0.0,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
        )

    def record(self, timings: Timings, outcome: str) -> RequestRecord:
        """This request as the stats' recent-requests list shows it."""
        return RequestRecord(
            request_id=self.request_id,
            kind=self.request.kind,
            model_alias=self.request.model_alias,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            ttft_s=timings.ttft_s,
            decode_tps=timings.decode_tps,
            outcome=outcome,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
            cache_key=self.request.cache_key,
            cache_reuse=self.cache_reuse or "",
        )

    def flush(self) -> None:
        """Send this step's events in one cross-thread call."""
        if self.pending:
            self.sink.send(self.pending)
            self.pending = []
