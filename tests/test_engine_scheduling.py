"""Engine: continuous batching, cancellation, admission control, failures and lifetime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from engine_helpers import collect, engine_maker, wait_until

from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    Admitted,
    ChatMessage,
    Done,
    EngineEvent,
    EngineUnavailable,
    GenerationFailed,
    GenerationRequest,
    Overloaded,
    Sampling,
    TextDelta,
)
from mlxlaunch.testing.failing import ForwardFailures, fail_forward
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

WORDS = " ".join(f"w{i}" for i in range(2000))  # a long script: thousands of tokens


def request(request_id: str, max_tokens: int = 3000, text: str | None = None) -> GenerationRequest:
    # Distinct prompts by default: identical concurrent requests share one generation.
    return GenerationRequest(
        messages=[ChatMessage("user", text or f"hi from {request_id}")],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        request_id=request_id,
    )


class Gate:
    """A logits hook that scripts requests and holds the worker inside one request's step.

    While held, the worker can take no command; on release it finishes the step and then
    handles whatever was posted meanwhile — which is how "within one step" is tested.
    """

    def __init__(self, scripted: ScriptedOutput, hold_id: str, at_step: int = 4) -> None:
        self.scripted = scripted
        self.hold_id = hold_id
        self.at_step = at_step
        self.calls = 0
        self.reached = threading.Event()
        self.release = threading.Event()
        self.started: list[str] = []

    def __call__(self, request: GenerationRequest, tokenizer: Any) -> list[Any]:
        self.started.append(request.request_id)
        processors = list(self.scripted(request, tokenizer) or [])
        if request.request_id == self.hold_id:
            processors.append(self._hold)
        return processors

    def _hold(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self.calls += 1
        if self.calls == self.at_step:
            self.reached.set()
            self.release.wait(10)
        return logits

    async def held(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 10)


@pytest.fixture
def make_engine(tiny_model_dir: Path) -> Iterator[Callable[..., Engine]]:
    with engine_maker(tiny_model_dir) as make:
        yield make


async def test_a_request_joins_a_running_batch(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    engine = make_engine(logits_hook=scripted, max_concurrency=4)
    scripted.enqueue(WORDS)
    scripted.enqueue("short answer")
    order: list[tuple[str, str]] = []

    async def consume(req: GenerationRequest) -> None:
        async for event in engine.submit(req):
            order.append((req.request_id, type(event).__name__))

    long_task = asyncio.create_task(consume(request("long")))
    await wait_until(lambda: ("long", "TextDelta") in order)
    await consume(request("short"))
    assert ("short", "Done") in order
    assert ("long", "Done") not in order  # the short one finished while the long one ran
    assert engine.stats().running == 1
    engine.cancel("long")
    await long_task
    assert order[-1] == ("long", "Done")


async def test_concurrent_requests_decode_together(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    engine = make_engine(logits_hook=scripted, max_concurrency=2)
    scripted.enqueue(WORDS)
    scripted.enqueue(WORDS)
    order: list[tuple[str, str]] = []

    async def consume(req: GenerationRequest) -> None:
        async for event in engine.submit(req):
            order.append((req.request_id, type(event).__name__))

    await asyncio.gather(consume(request("a", 200)), consume(request("b", 200)))
    first_done = min(order.index(("a", "Done")), order.index(("b", "Done")))
    assert ("a", "TextDelta") in order[:first_done]
    assert ("b", "TextDelta") in order[:first_done]


def held_at(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput, request_id: str, at_step: int
) -> tuple[Gate, Engine, AsyncIterator[EngineEvent]]:
    """A long request `request_id` on a new engine whose gate holds it at step `at_step`."""
    gate = Gate(scripted, hold_id=request_id, at_step=at_step)
    engine = make_engine(logits_hook=gate)
    scripted.enqueue(WORDS)
    return gate, engine, engine.submit(request(request_id))


async def test_cancel_mid_generation_frees_the_slot_within_one_step(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    gate, engine, events = held_at(make_engine, scripted, "doomed", at_step=4)
    assert isinstance(await anext(events), Admitted)
    await gate.held()
    assert engine.stats().running == 1
    engine.cancel("doomed")
    gate.release.set()
    rest = await collect(events)
    done = rest[-1]
    assert isinstance(done, Done) and done.stop_reason == "cancelled"
    assert done.usage.output_tokens <= gate.at_step + 1  # the held step, nothing after it
    stats = engine.stats()
    assert stats.running == 0 and stats.counters.requests_cancelled == 1
    assert stats.recent[-1].outcome == "cancelled"


async def test_closing_the_iterator_cancels_the_request(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    gate, engine, events = held_at(make_engine, scripted, "gone", at_step=6)
    async for event in events:
        if isinstance(event, TextDelta):
            break
    await gate.held()
    await events.aclose()  # type: ignore[attr-defined]
    gate.release.set()
    await wait_until(lambda: engine.stats().running == 0)
    assert engine.stats().counters.requests_cancelled == 1
    assert engine.stats().recent[-1].output_tokens <= gate.at_step + 1


async def test_a_cancelled_queued_request_never_starts(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    gate = Gate(scripted, hold_id="")  # records which requests start; holds nothing
    engine = make_engine(logits_hook=gate, max_concurrency=1)
    scripted.enqueue(WORDS)
    running = engine.submit(request("running"))
    await anext(running)  # Admitted
    await wait_until(lambda: engine.stats().running == 1)
    queued = engine.submit(request("queued"))
    assert isinstance(await anext(queued), Admitted)
    assert engine.stats().queue_depth == 1
    engine.cancel("queued")
    rest = await collect(queued)
    done = rest[-1]
    assert isinstance(done, Done) and done.stop_reason == "cancelled"
    assert done.usage.output_tokens == 0
    engine.cancel("running")
    await collect(running)
    assert gate.started == ["running"]
    assert engine.stats().queue_depth == 0


async def test_admission_bounds_refuse_with_retry_after(
    make_engine: Callable[..., Engine], scripted: ScriptedOutput
) -> None:
    engine = make_engine(logits_hook=scripted, max_concurrency=1, max_queue=1)
    scripted.enqueue(WORDS)
    running = engine.submit(request("running"))
    await anext(running)
    await wait_until(lambda: engine.stats().running == 1)
    waiting = engine.submit(request("waiting"))
    await anext(waiting)
    await wait_until(lambda: engine.stats().queue_depth == 1)
    with pytest.raises(Overloaded) as caught:
        await collect(engine.submit(request("refused")))
    assert caught.value.retry_after >= 1
    assert engine.stats().counters.requests_refused == 1
    engine.cancel("running")
    engine.cancel("waiting")
    await collect(running)
    await collect(waiting)
    # The queue emptied, so the bound admits again.
    events = await collect(engine.submit(request("later", max_tokens=3)))
    assert isinstance(events[-1], Done)


async def test_a_failing_forward_fails_the_request_and_the_engine_recovers(
    make_engine: Callable[..., Engine],
) -> None:
    failures = ForwardFailures()
    engine = make_engine(model_wrapper=fail_forward(failures))
    failures.fail_next(1, after=2)  # a few steps in: mid-generation
    with pytest.raises(GenerationFailed, match="injected forward failure"):
        await collect(engine.submit(request("unlucky", max_tokens=20)))
    assert failures.failures == 1
    events = await collect(engine.submit(request("next", max_tokens=5)))
    done = events[-1]
    assert isinstance(done, Done) and done.usage.output_tokens >= 1
    counters = engine.stats().counters
    assert counters.requests_failed == 1 and counters.requests_completed == 1
    assert engine.stats().recent[0].outcome == "failed"


async def test_load_unload_and_lazy_reload(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    assert engine.stats().state == "unloaded" and engine.model_info is None
    infos = await asyncio.gather(engine.load(), engine.load())  # one shared load
    assert infos[0] is infos[1]
    assert engine.stats().state == "loaded"
    assert infos[0].context_window > 0 and infos[0].has_thinking
    assert infos[0].tool_call_start == "<tool_call>" and infos[0].eos_token_ids
    await engine.unload()
    assert engine.stats().state == "unloaded" and engine.model_info is None
    events = await collect(engine.submit(request("after", max_tokens=2)))  # loads again
    assert isinstance(events[-1], Done)
    assert engine.stats().state == "loaded"


async def test_closed_engine_refuses_and_a_missing_model_is_unavailable(
    make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    missing = make_engine(model=str(tmp_path / "nowhere"))
    with pytest.raises(EngineUnavailable, match="could not be loaded"):
        await collect(missing.submit(request("x")))
    assert missing.stats().state == "unloaded"
    engine = make_engine()
    engine.close()
    with pytest.raises(EngineUnavailable):
        await collect(engine.submit(request("x")))


class LogitsProbe:
    """A logits processor that records a fingerprint of every step's logits, unchanged."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, Any]] = []

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self.steps.append((mx.max(logits).item(), mx.logsumexp(logits).item()))
        return logits


async def test_batching_does_not_change_the_logits(make_engine: Callable[..., Engine]) -> None:
    probes: dict[str, list[LogitsProbe]] = {}

    def hook(request: GenerationRequest, tokenizer: Any) -> list[LogitsProbe]:
        probe = LogitsProbe()
        probes.setdefault(request.request_id, []).append(probe)
        return [probe]

    engine = make_engine(max_concurrency=3, logits_hook=hook)
    texts = ["hi", "a longer prompt with many more words in it than the first", "mid length one"]
    reqs = [request(f"r{i}", max_tokens=12, text=t) for i, t in enumerate(texts)]
    for r in reqs:  # one at a time
        await collect(engine.submit(r))
    # Now prefilled (right-padded to one length) and decoded in one batch.
    await asyncio.gather(*(collect(engine.submit(r)) for r in reqs))
    for r in reqs:
        alone, together = probes[r.request_id]
        # Each has 12 steps, plus the look-ahead step the generator may start before it stops.
        assert len(alone.steps) >= 12 and len(together.steps) >= 12
        # Flattened: pytest.approx compares nested tuples exactly, not approximately; an
        # optimised BLAS may sum in another order for a batch, so allow float rounding.
        flat = [x for step in together.steps[:12] for x in step]
        assert flat == pytest.approx([x for step in alone.steps[:12] for x in step], rel=1e-4)


async def test_requests_racing_the_first_load_all_succeed(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that arrive while the model loads wait for it, renderer and caches included."""
    from mlxlaunch.engine.scheduling.prompt_caches import PromptCaches

    restore = PromptCaches.open
    restoring = threading.Event()

    def slow_restore(self: PromptCaches, loaded: Any) -> Any:
        restoring.set()
        time.sleep(0.5)  # a disk restore of big prefixes: the rest of the load waits on it
        return restore(self, loaded)

    monkeypatch.setattr(PromptCaches, "open", slow_restore)
    engine = make_engine()
    first = asyncio.ensure_future(collect(engine.submit(request("first", max_tokens=4))))
    await asyncio.to_thread(restoring.wait, 10)  # the weights are in; the load is not done
    later = [request(f"later-{i}", max_tokens=4) for i in range(4)]
    results = await asyncio.gather(first, *(collect(engine.submit(r)) for r in later))
    for events in results:
        assert isinstance(events[-1], Done), events
    assert engine.stats().counters.requests_failed == 0
