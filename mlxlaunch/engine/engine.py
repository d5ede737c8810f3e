"""The engine's public face: an async API over the MLX worker thread.

    engine = Engine(EngineConfig(model="path/or/hub-id"))
    async for event in engine.submit(request):   # Admitted, Progress, deltas, Done
        ...

`submit` renders and tokenizes the request off the event loop (under the tokenizer lock),
checks it against the context window (a prompt that cannot fit is refused in work bounded by
the window, not by the prompt: prompt/prompt_size.py) and admission bounds, and hands it to
the worker. Errors
that refuse a request (PromptTooLong, Overloaded, EngineUnavailable) are raised before the
first event; GenerationFailed can be raised later, in place of the next event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import uuid
from collections.abc import AsyncGenerator
from functools import partial
from typing import Any

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.drafting import PromptLookup
from mlxlaunch.engine.decoding.plan import (
    NO_PLAN,
    PLANNING_THREADS,
    DecodingPlan,
    needs_plan,
    plan_decoding,
)
from mlxlaunch.engine.prompt.render import RenderedPrompt

# How mlx-lm would split a model over ranks (the cluster checks ask it through the face).
from mlxlaunch.engine.runtime.shard_probe import probe_shards as probe_shards
from mlxlaunch.engine.runtime.vision import render_with_images
from mlxlaunch.engine.scheduling.conductor import Conductor
from mlxlaunch.engine.scheduling.duplicates import (
    DuplicateRegistry,
    SharedSink,
    deliver,
    generation_key,
)
from mlxlaunch.engine.scheduling.job import EventSink, Job
from mlxlaunch.engine.scheduling.sweeper import IdleSweeper
from mlxlaunch.engine.scheduling.worker import Worker
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
    Timings,
    Usage,
    images_in_order,
)
from mlxlaunch.errors import MlxLaunchError

log = logging.getLogger(__name__)


def model_load_failed(detail: str) -> EngineUnavailable:
    """What a client is told when the model cannot load: no path, no library text (both name
    the operator's files); the reason goes to the server log."""
    log.error("the model could not be loaded: %s", detail)
    return EngineUnavailable("the model could not be loaded (the server log says why)")


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

    def __init__(self, config: EngineConfig, conductor: Conductor | None = None) -> None:
        """`conductor`: the MLX thread this engine shares with other models' (models.py);
        None: a thread of its own."""
        self.config = config
        self._stats = StatsBook(config.clock, keep_records=config.recent_requests)
        self._admission = AdmissionQueue(config.max_queue, config.max_queued_tokens)
        self._sweeper = IdleSweeper(config.idle_clear_s, config.keep_alive_s, config.clock)
        self._duplicates = DuplicateRegistry()
        self._worker = Worker(
            config, self._stats, self._on_dequeue, self._sweeper, conductor=conductor
        )
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
            if future is not None and future.done() and self._worker.loaded is None:
                future = None  # unloaded since (keep-alive ran out): load again
            if future is None:
                future = concurrent.futures.Future()
                future.add_done_callback(self._forget_failed_load)
                self._load_future = future
                self._worker.post(partial(self._worker.load, future))
        self._sweeper.begin()  # a load is use too: keep-alive counts from its end
        try:
            return await asyncio.wrap_future(future)
        finally:
            self._sweeper.end()

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
    def lost(self) -> EngineUnavailable | None:
        """Why this engine can serve no more (a rank of its cluster is gone); None: it can."""
        return self._worker.cluster_lost

    @property
    def model_info(self) -> ModelInfo | None:
        """Facts about the loaded model, or None before the first load."""
        loaded = self._worker.loaded
        return loaded.info if loaded is not None else None

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        """The facts of the model serving `model_id`: this engine serves every id."""
        return self.model_info

    def served_models(self) -> list[tuple[str | None, ModelInfo | None]]:
        """The one model this engine serves, listed under the server's id."""
        return [(None, self.model_info)]

    async def loaded_model_info(self, model_id: str) -> ModelInfo:
        """The facts of the model serving `model_id` (this engine's), loading it if need be."""
        return await self._loaded_info()

    # --- requests -----------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        """Generate for `request`: Admitted, Progress…, Text/Thinking/ToolCall events, Done.

        An async generator: refusals (PromptTooLong, Overloaded, InvalidRequest,
        EngineUnavailable) are raised by the first `__anext__`, before any event. Closing the
        iterator early (or cancelling the task consuming it) cancels the request within one
        step. A request identical to a running one shares its generation (see duplicates.py).
        """
        self._sweeper.begin()  # from here the sweeper leaves the model alone
        try:
            sink, request_id = await self._admit(request)
            finished = False
            try:
                while True:
                    item = await sink.queue.get()
                    if isinstance(item, BaseException):
                        finished = True
                        raise item
                    for event in item:
                        if isinstance(event, Done):
                            finished = True
                        yield event
                        if finished:
                            return
            finally:
                self._leave(request_id, finished)
        finally:
            self._sweeper.end()

    async def _admit(self, request: GenerationRequest) -> tuple[EventSink, str]:
        """Render, check and queue `request` (or join its running duplicate)."""
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1")
        info = await self._loaded_info()
        window = info.context_window
        try:
            # Refused in work bounded by the window, not by the prompt (prompt/prompt_size.py).
            rendered = await self._render(request, window)
        except PromptTooLong:
            self._stats.count(requests_refused=1)
            raise
        prompt_tokens = len(rendered.tokens)
        decoding = await self._plan_decoding(request, rendered)  # InvalidRequest: a 400
        # The prompt's n-gram index for drafting, built here: tens of ms for a long prompt.
        drafter = (
            await asyncio.to_thread(PromptLookup, rendered.tokens)
            if self._worker.speculation.lookup
            else None
        )
        room = window - prompt_tokens
        max_tokens = min(request.max_tokens, room)
        request_id = request.request_id or f"req_{uuid.uuid4().hex[:16]}"
        loop = asyncio.get_running_loop()
        key = generation_key(rendered.tokens, request, max_tokens) if self.config.dedupe else None
        if key is not None and (joined := self._duplicates.attach(key, request_id, loop)):
            self._stats.count(requests_deduplicated=1)
            log.info("%s: identical to a running request; sharing its generation", request_id)
            return joined, request_id
        if max_tokens < request.max_tokens:
            log.info(
                "%s: max_tokens %d clamped to %d (the %d-token prompt leaves that much of the "
                "%d-token context window)",
                request_id, request.max_tokens, max_tokens, prompt_tokens, window,
            )  # fmt: skip
        try:
            self._admission.enter(prompt_tokens, self._stats.prefill_tps())
        except Overloaded:
            self._stats.count(requests_refused=1, requests_overloaded=1)
            raise
        self._stats.queued_tokens = self._admission.tokens
        sink = SharedSink(loop, request_id)
        job = Job(
            request_id=request_id,
            request=request,
            prompt=rendered.tokens,
            max_tokens=max_tokens,
            clamped=max_tokens < request.max_tokens,
            opens_thinking=rendered.opens_thinking,
            sink=sink,
            decoding=decoding,
            submitted_at=self.config.clock(),
            drafter=drafter,
            images=rendered.images,
        )
        try:
            self._worker.post(partial(self._worker.enqueue, job))
        except EngineUnavailable:
            self._admission.leave(prompt_tokens)
            self._stats.queued_tokens = self._admission.tokens
            raise
        self._duplicates.register(key, request_id, job, sink)
        return sink, request_id

    def _leave(self, request_id: str, finished: bool) -> None:
        """A consumer stopped listening; the last one to leave early cancels the job."""
        job, _ = self._duplicates.leave(request_id)
        if job is not None and not finished and not job.finished:
            with contextlib.suppress(EngineUnavailable):  # free the batch slot
                self._worker.post(partial(self._worker.cancel_job, job))

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request; its stream ends with Done("cancelled").

        A request sharing its generation with duplicates only stops listening: the others
        keep receiving it, and the generation stops when its last listener is gone.
        """
        if not self._started or self._closed:
            return
        job: Job | None = None
        if self._duplicates.listeners(request_id) > 1:
            # Others still listen: end this listener's stream here, leave the job running.
            job, sink = self._duplicates.leave(request_id)
            if sink is not None:
                usage = Usage(0, 0, 0)
                deliver(sink, [Done("cancelled", usage, None, Timings(0.0, 0.0, 0.0, 0.0))])
            if job is None:
                return
        job = job or self._duplicates.job_of(request_id)
        with contextlib.suppress(EngineUnavailable):
            if job is not None:  # the last listener: its Done comes from the worker
                self._worker.post(partial(self._worker.cancel_job, job))
            else:
                self._worker.post(partial(self._worker.cancel_request, request_id))

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The exact number of prompt tokens `submit(request)` would have."""
        self._sweeper.begin()
        try:
            info = await self._loaded_info()
            # Exact, over the window too, unless the prompt certainly cannot fit: then it is
            # refused as submit refuses it (counting 32 MiB exactly costs 40 s and 4 GB).
            rendered = await self._render(request, info.context_window, exact=True)
            return len(rendered.tokens)
        finally:
            self._sweeper.end()

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
            raise model_load_failed(exc.message) from exc

    async def _render(
        self, request: GenerationRequest, limit: int | None, *, exact: bool = False
    ) -> RenderedPrompt:
        renderer = self._worker.renderer
        if renderer is None:  # still loading, or unloaded by the idle sweeper: wait for the load
            # The shared load future completes only once the renderer and caches exist (the
            # model itself may already be visible while cached prefixes are being restored).
            if self._closed:
                raise EngineUnavailable("the engine is closed")
            try:
                await self.load()
            except MlxLaunchError as exc:
                raise model_load_failed(exc.message) from exc
            renderer = self._worker.renderer
        if renderer is None:
            raise EngineUnavailable("no model is loaded")
        render = partial(renderer.render, request, limit, exact=exact)
        if request.images:  # rendered, then each image token widened to its image's run
            loaded = self._worker.loaded
            vision = loaded.vision if loaded is not None else None
            if vision is None:
                raise InvalidRequest("this model does not accept images (it has no vision)")
            try:
                placed = [request.images[i] for i in images_in_order(request.messages)]
            except IndexError:
                raise InvalidRequest(
                    "a message places an image the request does not hold"
                ) from None
            render = partial(render_with_images, render, vision, placed, limit, exact)
        try:
            return await asyncio.to_thread(render)
        except PromptTooLong:
            raise
        except Exception as exc:  # template errors are about the request's content
            raise InvalidRequest(f"the prompt could not be rendered: {exc}") from exc

    async def _plan_decoding(
        self, request: GenerationRequest, rendered: RenderedPrompt
    ) -> DecodingPlan:
        """Compile the request's constraints and thinking budget (see engine/decoding/plan.py).

        On the planning threads, not the default executor: a grammar's compilation (bounded,
        but tens of milliseconds for a large one) must not queue other requests' rendering.
        The tokenizer lock is passed down and taken only around the tokenizer calls."""
        if not needs_plan(request):
            return NO_PLAN
        loaded = self._worker.loaded
        while loaded is None:  # unloaded by keep-alive since rendering: a plan needs the model
            await self._loaded_info()
            loaded = self._worker.loaded
        build = partial(
            plan_decoding,
            request,
            opens_thinking=rendered.opens_thinking,
            tokenizer=loaded.tokenizer,
            info=loaded.info,
            lock=self._worker.tokenizer_lock,
        )
        return await asyncio.get_running_loop().run_in_executor(PLANNING_THREADS, build)

    def _on_dequeue(self, job: Job) -> None:
        self._admission.leave(job.prompt_tokens)
        self._stats.queued_tokens = self._admission.tokens

    def _forget_failed_load(self, future: concurrent.futures.Future[ModelInfo]) -> None:
        if future.exception() is not None:
            with self._lock:
                if self._load_future is future:
                    self._load_future = None


# --- several ranks (engine/scheduling/lockstep.py) ----------------------------------------


def join_cluster() -> Any:
    """This process's rank group, as `mlx.launch` set it up (a `RankGroup`: `rank`, `size`,
    `leads`, `gather_text`); the engine of rank 0 is built with it in `EngineConfig.cluster`.

    Raises:
        RuntimeError: MLX cannot join the group.
    """
    from mlxlaunch.engine.runtime.rank_group import RankGroup

    return RankGroup.joined()


def follow(config: EngineConfig) -> int:
    """Run a rank other than 0 until rank 0 says stop; its exit code (engine/scheduling/
    follower.py)."""
    from mlxlaunch.engine.scheduling.follower import Follower

    return Follower(config).run()
