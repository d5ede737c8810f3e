"""The engine's public face: an async API over the MLX worker thread.

    engine = Engine(EngineConfig(model="path/or/hub-id"))
    async for event in engine.submit(request):   # Admitted, Progress, deltas, Done
        ...

`submit` renders and tokenizes the request off the event loop (under the tokenizer lock),
checks it against the context window and admission bounds, and hands it to the worker. Errors
that refuse a request (PromptTooLong, Overloaded, EngineUnavailable) are raised before the
first event; GenerationFailed can be raised later, in place of the next event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import uuid
from collections.abc import AsyncIterator
from functools import partial

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.job import EventSink, Job
from mlxlaunch.engine.render import RenderedPrompt
from mlxlaunch.engine.stats import EngineStats, StatsBook
from mlxlaunch.engine.types import (
    Done,
    EngineEvent,
    EngineUnavailable,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    Overloaded,
    PromptTooLong,
)
from mlxlaunch.engine.worker import Worker
from mlxlaunch.errors import MlxLaunchError

# Bounds of the retry-after hint given with Overloaded, in seconds.
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


class AdmissionQueue:
    """Counts requests waiting for a batch slot and refuses more than the configured bounds."""

    def __init__(self, max_requests: int, max_tokens: int) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self.requests = 0
        self.tokens = 0

    def enter(self, prompt_tokens: int, prefill_tps: float) -> None:
        """Count a request in, or raise Overloaded with a retry-after estimate."""
        with self._lock:
            too_many = self.requests + 1 > self.max_requests
            too_large = self.tokens + prompt_tokens > self.max_tokens
            if too_many or too_large:
                backlog_s = self.tokens / prefill_tps if prefill_tps > 0 else 0.0
                retry = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(backlog_s)))
                what = "requests" if too_many else "prompt tokens"
                raise Overloaded(f"the engine's queue is full ({what})", retry_after=retry)
            self.requests += 1
            self.tokens += prompt_tokens

    def leave(self, prompt_tokens: int) -> None:
        with self._lock:
            self.requests -= 1
            self.tokens -= prompt_tokens


class Engine:
    """One model, one MLX worker thread, many concurrent requests."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._stats = StatsBook(config.clock, keep_records=config.recent_requests)
        self._admission = AdmissionQueue(config.max_queue, config.max_queued_tokens)
        self._worker = Worker(config, self._stats, self._on_dequeue)
        self._lock = threading.Lock()
        self._load_future: concurrent.futures.Future[ModelInfo] | None = None
        self._started = False
        self._closed = False

    # --- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (idempotent; submit and load start it too)."""
        with self._lock:
            if self._closed:
                raise EngineUnavailable("the engine is closed")
            if not self._started:
                self._worker.start()
                self._started = True

    def close(self) -> None:
        """Fail outstanding requests and stop the worker thread (blocks until it ends)."""
        with self._lock:
            self._closed = True
        self._worker.stop()

    async def load(self) -> ModelInfo:
        """Load the model on the worker thread; concurrent callers share one load."""
        self.start()
        with self._lock:
            future = self._load_future
            if future is None:
                future = concurrent.futures.Future()
                future.add_done_callback(self._forget_failed_load)
                self._load_future = future
                self._worker.post(partial(self._worker.load, future))
        return await asyncio.wrap_future(future)

    async def unload(self) -> None:
        """Fail running requests and release the model; the next submit loads it again."""
        if not self._started:
            return
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._load_future = None
            self._worker.post(partial(self._worker.unload, future))
        await asyncio.wrap_future(future)

    @property
    def model_info(self) -> ModelInfo | None:
        """Facts about the loaded model, or None before the first load."""
        loaded = self._worker.loaded
        return loaded.info if loaded is not None else None

    # --- requests -----------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """Generate for `request`: Admitted, Progress…, Text/Thinking/ToolCall events, Done.

        An async generator: refusals (PromptTooLong, Overloaded, InvalidRequest,
        EngineUnavailable) are raised by the first `__anext__`, before any event. Closing the
        iterator early (or cancelling the task consuming it) cancels the request within one
        step.
        """
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1")
        info = await self._loaded_info()
        rendered = await self._render(request)
        prompt_tokens = len(rendered.tokens)
        window = info.context_window
        if prompt_tokens >= window:
            self._stats.count(requests_refused=1)
            raise PromptTooLong(prompt_tokens, window)
        room = window - prompt_tokens
        max_tokens = min(request.max_tokens, room)
        try:
            self._admission.enter(prompt_tokens, self._stats.snapshot().prefill_tps)
        except Overloaded:
            self._stats.count(requests_refused=1)
            raise
        job = Job(
            request_id=request.request_id or f"req_{uuid.uuid4().hex[:16]}",
            request=request,
            prompt=rendered.tokens,
            max_tokens=max_tokens,
            clamped=max_tokens < request.max_tokens,
            opens_thinking=rendered.opens_thinking,
            sink=EventSink(asyncio.get_running_loop()),
            submitted_at=self.config.clock(),
        )
        try:
            self._worker.post(partial(self._worker.enqueue, job))
        except EngineUnavailable:
            self._admission.leave(prompt_tokens)
            raise
        try:
            while True:
                item = await job.sink.queue.get()
                if isinstance(item, BaseException):
                    raise item
                for event in item:
                    yield event
                    if isinstance(event, Done):
                        return
        finally:
            if not job.finished:  # the consumer left early: free the batch slot
                with contextlib.suppress(EngineUnavailable):
                    self._worker.post(partial(self._worker.cancel_job, job))

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request; its stream ends with Done("cancelled")."""
        if self._started and not self._closed:
            self._worker.post(partial(self._worker.cancel_request, request_id))

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The exact number of prompt tokens `submit(request)` would have."""
        await self._loaded_info()
        return len((await self._render(request)).tokens)

    def stats(self) -> EngineStats:
        """A snapshot of the engine's state, counters and recent requests."""
        return self._stats.snapshot()

    # --- internals ----------------------------------------------------------------------

    async def _loaded_info(self) -> ModelInfo:
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        info = self.model_info
        if info is not None:
            return info
        try:
            return await self.load()
        except MlxLaunchError as exc:
            raise EngineUnavailable(f"the model could not be loaded: {exc.message}") from exc

    async def _render(self, request: GenerationRequest) -> RenderedPrompt:
        renderer = self._worker.renderer
        if renderer is None:
            raise EngineUnavailable("no model is loaded")
        try:
            return await asyncio.to_thread(renderer.render, request)
        except Exception as exc:  # template errors are about the request's content
            raise InvalidRequest(f"the prompt could not be rendered: {exc}") from exc

    def _on_dequeue(self, job: Job) -> None:
        self._admission.leave(job.prompt_tokens)

    def _forget_failed_load(self, future: concurrent.futures.Future[ModelInfo]) -> None:
        if future.exception() is not None:
            with self._lock:
                if self._load_future is future:
                    self._load_future = None
