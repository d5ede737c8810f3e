"""The engine worker: the one thread that owns MLX (a reusable one, see `runtime/mlx_thread`).

Every MLX call — loading, prefill, decode, cache handling — happens on this thread. Other
threads hand it work with `post(fn)` (a callable run between steps); results go back through
each job's `EventSink`. Generation runs on one `Batch` (batch.py), so requests decode together
(several tokens per step where drafts are accepted: speculative decoding) and long prompts
prefill in slices interleaved with decode steps, each slice sized to a share of the decode
step's time (see `prefill_pacing`).

Why over 600 lines: this is one class, the only writer of the thread's state (the queue, the
batch, the loaded model, the cluster's lockstep), and every method reads that state between two
steps. The parts that need none of it already live beside it (batch, job, prefill_pacing,
prompt_caches, retention, lockstep); cutting the rest would pass the worker's fields around.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import mlx.core as mx

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.grammar import forget_tokenizer
from mlxlaunch.engine.decoding.sampling import penalty_processors, resolve_sampling, sampler_for
from mlxlaunch.engine.output.parser_config import output_parser, parser_config
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.prompt.render_date import pinned_render_date
from mlxlaunch.engine.runtime import cpu_attention, freed_memory
from mlxlaunch.engine.runtime.loader import LoadedModel, load_model
from mlxlaunch.engine.runtime.memory import (
    MemoryBudget,
    memory_budget,
    window_that_fits,
)
from mlxlaunch.engine.runtime.mlx_thread import run_on_mlx_thread
from mlxlaunch.engine.scheduling.batch import Batch, greedy, make_batch
from mlxlaunch.engine.scheduling.conductor import Command, Conductor, drain_commands
from mlxlaunch.engine.scheduling.job import Job, OutputStream, batched_delivery
from mlxlaunch.engine.scheduling.lockstep import Lockstep, cluster_insert
from mlxlaunch.engine.scheduling.main_first import (
    is_main,
    next_waiting,
    prefilling,
    step_is_urgent,
    worker_is_urgent,
)
from mlxlaunch.engine.scheduling.prefill_pacing import PrefillPacer
from mlxlaunch.engine.scheduling.prompt_caches import PromptCaches
from mlxlaunch.engine.scheduling.retention import adopt_reply
from mlxlaunch.engine.scheduling.speculation import OFF, plan_speculation
from mlxlaunch.engine.scheduling.speed_window import SpeedWindow
from mlxlaunch.engine.scheduling.sweeper import IdleSweeper
from mlxlaunch.engine.scheduling.warmup import RESTORED_WARMUP_TOKENS, warm_up_loaded
from mlxlaunch.engine.stats import StatsBook
from mlxlaunch.engine.types import (
    Admitted,
    ClusterLost,
    Done,
    EngineUnavailable,
    GenerationFailed,
    Progress,
    Sampling,
    StopReason,
    Timings,
    Usage,
)

# Prefixes are written to disk only after this long (seconds) without requests, a step of a
# few ms per loop (see cache/disk.py): Claude Code's next turn often arrives within a second
# of the last answer (a quick tool call), and the batch's memory traffic should not share
# the machine with the write. A request that arrives during a save waits one step.
SAVE_AFTER_IDLE_S = 1.0
# How often (seconds) the worker refreshes the memory figures in stats.
MEMORY_POLL_S = 1.0


class Worker:
    """Runs the MLX thread. Public methods marked "worker thread" must run via `post`."""

    def __init__(
        self,
        config: EngineConfig,
        stats: StatsBook,
        on_dequeue: Callable[[Job], None],
        sweeper: IdleSweeper | None = None,
        conductor: Conductor | None = None,
    ) -> None:
        self.config = config
        # Several models: their workers share one MLX thread (conductor.py); None: its own.
        self._conductor = conductor
        self.stats = stats
        self._sweeper = sweeper  # idle cache clear and keep-alive unload; None: never
        self._memory: MemoryBudget | None = None  # set at load
        self._on_dequeue = on_dequeue  # admission control: the job left the waiting queue
        self._commands: queue.SimpleQueue[Command | None] = (
            conductor.commands if conductor is not None else queue.SimpleQueue()
        )
        self._finished: threading.Event | None = None  # set when the loop has ended
        self._stopping = False
        self._post_lock = threading.Lock()
        self.tokenizer_lock = threading.Lock()
        self.loaded: LoadedModel | None = None
        self.renderer: PromptRenderer | None = None
        self.speculation = OFF  # decided at load: how sequences draft (speculative decoding)
        self._generator: Batch | None = None
        self._waiting: deque[Job] = deque()
        self._running: dict[int, Job] = {}  # batch uid -> job
        self._by_request_id: dict[str, Job] = {}
        self._caches = PromptCaches(config, stats, self.tokenizer_lock)  # set up at load
        # On a cluster: rank 0's channel to the other ranks (engine/cluster/), else None.
        self._lockstep = Lockstep(config.cluster.group) if config.cluster is not None else None
        self.cluster_lost: ClusterLost | None = None  # why a cluster's serve must end
        self._pacer = PrefillPacer(config.prefill_chunk)
        self._memory_polled_at = float("-inf")
        self._idle_since: float | None = None  # when the batch and queue last became empty
        self._speeds = SpeedWindow(stats, config.clock)

    # --- any thread ---------------------------------------------------------------------

    def start(self) -> None:
        if self._finished is None:
            freed_memory.keep()  # each request's buffers reused, not faulted in afresh
            if self._conductor is not None:
                self._finished = self._conductor.join(self)
            else:
                self._finished = run_on_mlx_thread(self._run)

    def post(self, command: Command) -> None:
        """Run `command` on the worker thread between two steps."""
        # The lock orders posts against stop(): nothing lands after the final drain.
        with self._post_lock:
            if self._stopping:
                raise EngineUnavailable("the engine is shutting down")
            self._commands.put(command)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Fail outstanding work, release the model and end the thread."""
        with self._post_lock:
            self._stopping = True
            self._commands.put(None)  # wake an idle worker
        if self._finished is not None:
            self._finished.wait(timeout)

    # --- worker thread: commands --------------------------------------------------------

    def load(self, done: concurrent.futures.Future[Any]) -> None:
        """Worker thread: load the configured model (no-op when loaded)."""
        if not done.set_running_or_notify_cancel():
            return
        if self._stopping:
            done.set_exception(EngineUnavailable("the engine is shutting down"))
            return
        try:
            self._ensure_loaded()
        except BaseException as exc:
            done.set_exception(exc)
        else:
            done.set_result(self.loaded.info if self.loaded else None)

    def unload(self, done: concurrent.futures.Future[Any]) -> None:
        """Worker thread: fail outstanding work and drop the model and its memory."""
        if not done.set_running_or_notify_cancel():
            return
        self._abandon_all(EngineUnavailable("the model was unloaded"))
        if self._lockstep is not None and self.loaded is not None:
            self._lockstep.unload()
        self._caches.save(one_step=False)  # the prefixes queued for disk, while they exist
        self._close_generator()
        if self.loaded is not None:  # the grammar cache would keep the tokenizer alive
            forget_tokenizer(self.loaded.tokenizer)
        self.loaded = None
        self.renderer = None
        self._memory = None
        self._caches.close()
        self.stats.state = "unloaded"
        gc.collect()
        mx.clear_cache()
        freed_memory.release()
        done.set_result(None)

    def enqueue(self, job: Job) -> None:
        """Worker thread: accept a job, tell the caller it is admitted, queue it for a slot.
        A fault here (a bug, not the request's) fails this request with a 500 and a log line
        with the traceback: it must not leave the client waiting for an answer."""
        try:
            self._enqueue(job)
        except Exception as exc:
            logging.getLogger(__name__).exception("%s could not be queued", job.request_id)
            if job in self._waiting:
                self._waiting.remove(job)
            self._end_with_error(job, GenerationFailed(f"could not queue the request: {exc}"))

    def _enqueue(self, job: Job) -> None:
        if job.finished:  # cancelled before it got here
            return
        if self._stopping:
            self._end_with_error(job, EngineUnavailable("the engine is shutting down"))
            return
        try:
            self._ensure_loaded()
        except Exception as exc:
            logging.getLogger(__name__).error("the model could not be loaded: %s", exc)
            self._end_with_error(
                job, EngineUnavailable("the model could not be loaded (the server log says why)")
            )
            return
        job.cached_tokens, reuse = self._caches.plan(job)
        job.cache_reuse = reuse
        self._by_request_id[job.request_id] = job
        self.stats.count(requests_admitted=1)
        self._waiting.append(job)
        self.stats.queue_depth = len(self._waiting)
        job.sink.send(
            [
                Admitted(
                    request_id=job.request_id,
                    prompt_tokens=job.prompt_tokens,
                    cached_tokens=job.cached_tokens,
                    max_tokens=job.max_tokens,
                    clamped=job.clamped,
                    cache_reuse=reuse,
                )
            ]
        )

    def cancel_request(self, request_id: str) -> None:
        """Worker thread: cancel by request id (a no-op for unknown or finished ids)."""
        job = self._by_request_id.get(request_id)
        if job is not None:
            self.cancel_job(job)

    def cancel_job(self, job: Job) -> None:
        """Worker thread: stop a job now; a queued job never starts."""
        if job.finished:
            return
        in_batch = job.uid is not None and job.uid in self._running
        if not in_batch and job in self._waiting:
            self._waiting.remove(job)
            self._leave_queue(job)
        # Counted and recorded before the slot shows free: whoever sees it free sees why.
        self.stats.count(requests_cancelled=1)
        self._finish(job, "cancelled", outcome="cancelled")
        if in_batch:
            self._remove_from_batch(job)

    # --- worker thread: the loop --------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            idle = self.settle()
            drain_commands(self._commands, self.wait_timeout() if idle else 0.0)
            if self._stopping:
                break
            self.turn(idle)
        self.wind_down()

    # --- worker thread: one turn of the loop (a Conductor runs several workers' turns) ----

    @property
    def stopping(self) -> bool:
        """The loop should end (stop() was called, or the cluster is lost)."""
        return self._stopping

    def settle(self) -> bool:
        """Before waiting for commands: note an idle spell, write due prefixes; whether the
        worker is idle (nothing running or queued)."""
        idle = not self._running and not self._waiting
        if not idle:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = self.config.clock()
            self._speeds.end()  # count the last window before waiting for work
        if idle and self._idle_for() >= SAVE_AFTER_IDLE_S and self._caches.saves_pending:
            if self._lockstep is not None:  # each rank writes its own shard's entries
                self._cluster_call(lambda: self._lockstep.save(True))  # type: ignore[union-attr]
            self._caches.save(one_step=True)
        return idle

    def wait_timeout(self) -> float | None:
        """How long an idle worker may wait for a command (None: until one comes): it wakes
        now and then so the sweeper can act on time, and when its prefix saves fall due."""
        timeout = self.config.sweep_poll_s if self._sweeper is not None else None
        if self._caches.saves_pending:
            wait = SAVE_AFTER_IDLE_S - self._idle_for()
            due = wait + 0.01 if wait > 0 else 0.0  # under way: only look for commands
            timeout = due if timeout is None else min(timeout, due)
        if self._lockstep is not None:  # the idle beat (engine/cluster/leader.py)
            beat = self._lockstep.beat_due() + 0.01
            timeout = beat if timeout is None else min(timeout, beat)
        return timeout

    def turn(self, idle: bool) -> None:
        """After the commands: the idle chores, or one step of the batch. A fault that gets
        this far (a bug) fails the batch's requests with a 500 and a logged traceback, and
        the loop goes on: none of them is left waiting, and the queued ones are served."""
        try:
            self._turn(idle)
        except Exception as exc:
            logging.getLogger(__name__).exception("an engine step failed")
            self._fail_batch(exc)

    def _turn(self, idle: bool) -> None:
        if idle and self._lockstep is not None and not self._lockstep.beat_due():
            self._cluster_call(self._lockstep.beat)
        if idle and not self._running and not self._waiting:
            self._sweep()
        with batched_delivery():  # one wake-up of each event loop per step
            self._start_waiting()
            if self._running:
                self._step()
            else:
                self._pacer.pause()
        self._poll_memory()

    def wind_down(self) -> None:
        """The loop has ended: fail what is left, save prefixes, release the model."""
        drain_commands(self._commands, 0.0)  # commands posted before stop(): see `_stopping`
        self._abandon_all(EngineUnavailable("the engine is shutting down"))
        self._caches.save(one_step=False)
        self._close_generator()
        if self._lockstep is not None:
            self._lockstep.stop()
        self.loaded = None

    @property
    def urgent(self) -> bool:
        """An interactive main-loop request is prefilling: the user waits on its first token
        (a Conductor steps other models' workers less often meanwhile)."""
        return worker_is_urgent(self._running.values(), self._waiting)

    def _idle_for(self) -> float:
        since = self._idle_since
        return 0.0 if since is None else self.config.clock() - since

    def _start_waiting(self) -> None:
        """Move queued jobs into the batch while there are free slots."""
        while self._waiting and len(self._running) < self.config.max_concurrency:
            job = next_waiting(self._waiting)
            self._leave_queue(job)
            try:
                self._insert(job)
            except Exception as exc:
                self._end_with_error(job, GenerationFailed(f"could not start generation: {exc}"))
                if job.shared:  # the other ranks took it: they and rank 0 now differ
                    self._lose_cluster(exc)
                    return

    def _insert(self, job: Job) -> None:
        loaded = self._require_loaded()
        if self._memory is not None:  # fail this request alone, before it touches the batch
            self._memory.check(job.prompt_tokens + job.max_tokens)
        generator = self._batch_generator()
        request = job.request
        config = parser_config(
            loaded.info, loaded.tool_parser, request, opens_thinking=job.opens_thinking
        )
        parser = output_parser(loaded.info, config)
        job.output = OutputStream(loaded.tokenizer, parser, self.tokenizer_lock)
        # The client's settings over the model's defaults; the penalty goes before the
        # decoding plan's processors, whose grammar and budget must have the last word.
        sampling = resolve_sampling(request.sampling, loaded.info.sampling_defaults)
        sampler: Any = sampler_for(sampling)  # None: the generator's shared greedy sampler
        processors = penalty_processors(sampling) + self._logits_processors(job)
        lockstep = self._lockstep
        if lockstep is not None:  # the other ranks take the job too, and rank 0's tokens
            lockstep.insert(cluster_insert(job, own_sampler=sampler is not None))
            job.shared = True
            sampler = lockstep.sampler(sampler) if sampler is not None else None
            processors = [lockstep.watch_logits, *processors] if processors else []
        agree = lockstep.agree if lockstep is not None else None
        cache = self._caches.cache_for(job, loaded.base_model, agree)
        uid = generator.insert(
            job.prompt[job.cached_tokens :],
            max_tokens=job.max_tokens,
            cache=cache,
            held=job.prompt[: job.cached_tokens],  # the tokens `cache` holds
            sampler=sampler,
            processors=processors,
            drafter=job.drafter,
            snapshot=self._caches.snapshots_wanted,
            urgent=is_main(job),
        )
        job.uid = uid
        job.started_at = self.config.clock()
        self._running[uid] = job
        self.stats.running = len(self._running)

    def _step(self) -> None:
        generator = self._batch_generator()
        self._speeds.measure(generator)
        jobs = self._running.values()
        prefills = [prefilling(job) for job in jobs]
        slice_tokens = self._pacer.plan(
            decoding=not all(prefills), prefilling=any(prefills), urgent=step_is_urgent(jobs)
        )
        try:  # the step's forward passes included (batch.py)
            if self._lockstep is not None:
                self._lockstep.step(slice_tokens)
            prompt_responses, generation_responses = generator.step(slice_tokens)
        except Exception as exc:
            self._fail_batch(exc)
            return
        touched: list[Job] = []
        for progress in prompt_responses:
            job = self._running.get(progress.uid)
            if job is None:
                continue
            done = job.cached_tokens + progress.done
            if not progress.ended:  # the prompt's last token is a decode-sized step
                self._pacer.prefilled(done - max(job.last_progress, job.cached_tokens))
            if done > job.last_progress:
                job.last_progress = done
                job.pending.append(Progress(done_tokens=done, total_tokens=job.prompt_tokens))
                touched.append(job)
            if progress.snapshot is not None:  # all but the prompt's last token are in
                self._caches.retain(job, {progress.uid: progress.snapshot})
        for response in generation_responses:
            job = self._running.get(response.uid)
            if job is None:
                continue
            job.drafted += response.drafted
            job.accepted += response.accepted
            last = len(response.tokens) - 1
            for i, token in enumerate(response.tokens):
                finish = response.finish_reason if i == last else None
                if finish == "stop" and self.renderer is not None and response.held is not None:
                    held = response.held[1]
                    if self.loaded is not None and self.loaded.vision is not None:
                        held = self.loaded.vision.collapse(held)  # as the template writes it
                    adopt_reply(self.renderer, held, token)
                try:
                    self._on_token(job, token, finish)
                except Exception as exc:  # parser or detokenizer trouble is this job's alone
                    self._output_failed(job, exc)
                    break
                if job.finished:  # a stop sequence, a tool call's end: the rest is not shown
                    break
            if response.held is not None:  # a finished sequence's prompt and output KV
                self._caches.retain(job, {response.uid: response.held})
            touched.append(job)
        for job in touched:
            job.flush()

    def _output_failed(self, job: Job, exc: Exception) -> None:
        self._remove_from_batch(job)
        self._end_with_error(job, GenerationFailed(f"output processing failed: {exc}"))

    def _on_token(self, job: Job, token: int, finish_reason: str | None) -> None:
        """Count and parse one generated token, and end the job when it ends the output."""
        output = job.output
        assert output is not None
        # A grammar that broke down mid-generation fails the request: its output must not
        # end as if complete (ConstraintBroken, through the job's own error path).
        job.decoding.check()
        if job.first_token_at is None:
            job.first_token_at = self.config.clock()
        job.output_tokens += 1
        if finish_reason == "stop":  # an end-of-turn token: never shown as text
            self._running.pop(job.uid or 0, None)
            self._complete(job, "end_turn")
            return
        job.pending.extend(output.push(token))
        if output.parser.done:  # a stop sequence, or the last allowed tool call
            self._remove_from_batch(job)
            self._complete(job, "stop_sequence" if output.parser.stopped else "tool_use")
        elif finish_reason == "length":
            self._running.pop(job.uid or 0, None)
            self._complete(job, "context_window" if job.clamped else "max_tokens")

    def _complete(self, job: Job, reason: StopReason) -> None:
        output = job.output
        assert output is not None
        job.pending.extend(output.close())
        if reason == "end_turn" and output.tool_calls:
            reason = "tool_use"
        self.stats.count(requests_completed=1)
        self._finish(job, reason, stop_sequence=output.parser.stopped_by, outcome=reason)

    # --- worker thread: endings ---------------------------------------------------------

    def _finish(
        self, job: Job, reason: StopReason, *, outcome: str, stop_sequence: str | None = None
    ) -> None:
        """Send Done (with this step's pending events) and record the request."""
        if job.finished:
            return
        now = self.config.clock()
        job.finished = True
        usage = Usage(job.prompt_tokens, job.cached_tokens, job.output_tokens)
        timings = job.timings(now)
        stop = stop_sequence if reason == "stop_sequence" else None
        # Stats first: whoever sees Done sees the request counted.
        self.stats.count(
            prompt_tokens=job.prompt_tokens,
            cached_tokens=job.cached_tokens,
            generated_tokens=job.output_tokens,
        )
        self._record(job, timings, outcome)
        self._forget(job)  # after the record: a free slot in stats comes with its record
        job.pending.append(Done(reason, usage, stop, timings))
        job.flush()

    def _end_with_error(self, job: Job, error: Exception) -> None:
        if job.finished:
            return
        if job.queued:
            self._leave_queue(job)
        job.finished = True
        self._forget(job)
        job.pending.clear()
        self.stats.count(requests_failed=1)
        self._record(job, job.timings(self.config.clock()), "failed")
        job.sink.send(error)

    def _fail_batch(self, exc: Exception) -> None:
        """A step failed: every job in the batch fails, the generator starts afresh (on a
        cluster the ranks may be mid-step apart: the cluster is lost)."""
        if self._lockstep is not None:
            self._lose_cluster(exc)
            return
        for job in list(self._running.values()):
            self._end_with_error(job, GenerationFailed(f"generation failed: {exc}"))
        self._running.clear()
        self.stats.running = 0
        self._close_generator()
        mx.clear_cache()

    def _cluster_call(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:
            self._lose_cluster(exc)

    def _lose_cluster(self, exc: Exception) -> None:
        """A rank is gone (or the ranks fell apart): fail everything, end the loop."""
        lost = exc if isinstance(exc, ClusterLost) else ClusterLost(f"the cluster failed: {exc}")
        logging.getLogger(__name__).error("cluster: %s; serving ends", lost)
        self.cluster_lost = lost
        if self._lockstep is not None:
            self._lockstep.broken = lost
        self._abandon_all(lost)
        self._stopping = True

    def _abandon_all(self, error: Exception) -> None:
        for job in list(self._running.values()) + list(self._waiting):
            self._end_with_error(job, error)
        self._running.clear()
        self._waiting.clear()
        self.stats.running = 0
        self.stats.queue_depth = 0

    def _forget(self, job: Job) -> None:
        if job.uid is not None:
            self._running.pop(job.uid, None)
            self.stats.running = len(self._running)
        if self._by_request_id.get(job.request_id) is job:
            del self._by_request_id[job.request_id]
        self._caches.forget(job)

    def _remove_from_batch(self, job: Job) -> None:
        if job.uid is None or self._generator is None:
            return
        self._running.pop(job.uid, None)
        self.stats.running = len(self._running)
        try:
            if self._lockstep is not None:
                self._lockstep.remove([job.uid])
            self._caches.retain(job, self._generator.remove([job.uid]))
        except Exception as exc:
            self._fail_batch(exc)

    def _leave_queue(self, job: Job) -> None:
        if job.queued:
            job.queued = False
            self._on_dequeue(job)
        self.stats.queue_depth = len(self._waiting)

    def _record(self, job: Job, timings: Timings, outcome: str) -> None:
        self.stats.record(job.record(timings, outcome))

    # --- worker thread: model, generator and cache seams --------------------------------

    def _ensure_loaded(self) -> None:
        if self.loaded is not None:
            return
        self.stats.state = "loading"
        try:
            if self._lockstep is not None:
                self._lockstep.load()
            loaded = load_model(self.config)
            cluster = self._lockstep is not None
            self.speculation = plan_speculation(self.config, loaded, cluster=cluster)
        except BaseException:
            self.stats.state = "unloaded"
            raise
        self.loaded = loaded
        cpu_attention.install(loaded.base_model)  # the CPU backend's, before the model runs
        self._memory = memory_budget(self.config.memory_fraction, loaded.base_model, loaded.kv)
        if self._memory is not None:
            self.stats.memory_limit_bytes = self._memory.limit
        # No longer a window than this machine holds the KV of (what clients are told).
        shards = self.config.cluster.group.size if self.config.cluster else 1
        window = window_that_fits(loaded.info.context_window, self._memory, loaded.kv, shards)
        loaded.info = replace(loaded.info, context_window=window)
        prefix = self._caches.open(loaded)
        disk = prefix.disk if prefix is not None else None
        self.renderer = PromptRenderer(
            loaded.tokenizer,
            self.tokenizer_lock,
            dialect=loaded.info.dialect,
            render_mode=self.config.render,
            # The date a template prints lives as long as the saved prefixes that hold it.
            pinned_date=pinned_render_date(disk.dir if disk is not None else None),
        )
        restored = prefix.restored_prompts() if prefix is not None else []
        self.renderer.warm(restored)  # the first prompt that continues one: incremental
        warm_up_loaded(  # MLX's first-pass set-up now, not in the first request's TTFT
            loaded.base_model,
            kv=loaded.kv,
            width=self.config.max_concurrency,
            prefill_chunk=self.config.prefill_chunk,
            # What a request that sets nothing samples with, compiled now.
            sampler=sampler_for(resolve_sampling(Sampling(), loaded.info.sampling_defaults)),
            restored=(  # not on a cluster: each rank restored its own prefixes
                prefix.warm_start_cache(RESTORED_WARMUP_TOKENS)
                if prefix is not None and self._lockstep is None
                else None
            ),
        )
        self.stats.model = loaded.info.id
        self.stats.kv_bits = loaded.kv.bits if loaded.kv is not None else 16
        self.stats.state = "loaded"

    def _require_loaded(self) -> LoadedModel:
        if self.loaded is None:
            raise EngineUnavailable("no model is loaded")
        return self.loaded

    def _batch_generator(self) -> Batch:
        if self._generator is None:
            loaded = self._require_loaded()
            sampler = self._lockstep.sampler(greedy) if self._lockstep is not None else None
            self._generator = make_batch(loaded, self.config, sampler, self.speculation)
        return self._generator

    def _close_generator(self) -> None:
        self._speeds.end()
        if self._generator is not None:
            self._generator.close()
            self._generator = None

    def _logits_processors(self, job: Job) -> list[Any]:
        """Per-sequence logits processors: the job's decoding plan (grammar constraint,
        thinking budget; fresh instances each call), then the test hook's (scripted output)."""
        processors = job.decoding.processors()
        hook = self.config.logits_hook
        if hook is not None:
            processors += list(hook(job.request, self._require_loaded().tokenizer) or [])
        return processors

    def _sweep(self) -> None:
        """Idle: clear the buffer cache or unload the model when the sweeper says so."""
        sweeper = self._sweeper
        if sweeper is None:
            return
        action = sweeper.due(loaded=self.loaded is not None, busy=False)
        if action == "unload":
            self.stats.count(idle_unloads=1)  # first: whoever sees "unloaded" sees it counted
            self.unload(concurrent.futures.Future())
        elif action == "clear":
            mx.clear_cache()
            freed_memory.release()  # what the C allocator kept (see runtime/freed_memory.py)
            self.stats.count(idle_cache_clears=1)
        else:
            return
        sweeper.done(action)
        self._poll_memory(force=True)

    def _poll_memory(self, force: bool = False) -> None:
        now = self.config.clock()
        if force or now - self._memory_polled_at >= MEMORY_POLL_S:
            self._memory_polled_at = now
            self.stats.memory_active_bytes = int(mx.get_active_memory())
            self.stats.memory_cache_bytes = int(mx.get_cache_memory())
        batch = self._generator  # every step: an idle engine reads 0 at once (no MLX call)
        self.stats.kv_running_bytes = batch.kv_bytes() if batch is not None and len(batch) else 0
