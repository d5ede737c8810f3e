"""Several models in one server (engine/models.py): one MLX thread, routing by model id, each
model's own stats, a small model that fails to load, and the main loop first."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import collect, text_of, wait_until

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.models import ModelSet, ServedModel
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    RequestKind,
    Sampling,
    TextDelta,
)
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here loads or serves models

TOKEN = "several-models"


def turn(
    request_id: str, text: str, max_tokens: int, *, model: str = "", kind: RequestKind = "other"
) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", text)],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        request_id=request_id,
        model_alias=model,
        kind=kind,
    )


def model_set(main: Path, small: Path | str, **config: Any) -> ModelSet:
    return ModelSet(
        [
            ServedModel(EngineConfig(model=str(main), **config), names=("big",)),
            ServedModel(EngineConfig(model=str(small), **config), names=("little",), role="small"),
        ]
    )


@contextmanager
def serving(models: ModelSet) -> Iterator[ServerHandle]:
    models.start()
    try:
        server = start_server(models, ServerSettings(auth_token=TOKEN, model_id="big"))
        try:
            yield server
        finally:
            server.stop()
    finally:
        models.close()


def generated(models: ModelSet) -> dict[str, int]:
    """Tokens generated so far by each model, by role."""
    return {m.role: m.counters.generated_tokens for m in models.stats().models}


def test_one_mlx_thread_runs_every_model(tiny_model_dir: Path, small_model_dir: Path) -> None:
    models = model_set(small_model_dir, tiny_model_dir)
    models.start()
    try:
        asyncio.run(models.load())
        seen: dict[str, int] = {}
        done = threading.Event()
        for model in models.models:
            engine = model.engine
            assert engine is not None

            def note(role: str = model.role) -> None:
                seen[role] = threading.get_ident()
                if len(seen) == 2:
                    done.set()

            engine._worker.post(note)
        assert done.wait(10)
        assert seen["main"] == seen["small"]  # DESIGN: exactly one thread owns MLX
        assert seen["main"] != threading.get_ident()
    finally:
        models.close()


def test_the_model_id_picks_the_model(tiny_model_dir: Path, small_model_dir: Path) -> None:
    """Haiku-tier ids and the small model's own names go to it; any other id, unknown ones
    included, to the main model; both answer with their own forward passes."""
    models = model_set(small_model_dir, tiny_model_dir)
    models.start()
    try:
        asyncio.run(models.load())
        cases = [
            ("claude-haiku-4-5-20251001", "small"),
            ("LITTLE", "small"),
            ("big", "main"),
            ("claude-sonnet-4-6", "main"),
            ("some-id-nobody-predicted", "main"),
        ]
        for i, (model_id, role) in enumerate(cases):
            before = generated(models)
            events = asyncio.run(
                collect(models.submit(turn(f"r{i}", f"hi {i}", 5, model=model_id)))
            )
            assert isinstance(events[-1], Done)
            after = generated(models)
            other = "main" if role == "small" else "small"
            assert after[role] == before[role] + events[-1].usage.output_tokens, model_id
            assert after[other] == before[other], model_id
        # The same prompt on the two models: two different random-weight models answer.
        small = asyncio.run(collect(models.submit(turn("a", "same", 8, model="little"))))
        main = asyncio.run(collect(models.submit(turn("b", "same", 8, model="big"))))
        assert text_of(small) != text_of(main)
    finally:
        models.close()


def test_both_models_are_listed_and_report_their_own_stats(
    tiny_model_dir: Path, small_model_dir: Path
) -> None:
    models = model_set(small_model_dir, tiny_model_dir)
    with serving(models) as server:
        asyncio.run(models.load())
        headers = {"authorization": f"Bearer {TOKEN}"}
        listing = httpx.get(server.url + "/v1/models", headers=headers).json()
        ids = [entry["id"] for entry in listing["data"]]
        assert ids == ["big", "little"]
        windows = {e["id"]: e["max_input_tokens"] for e in listing["data"]}
        for model in models.models:
            assert model.engine is not None and model.engine.model_info is not None
            assert windows[model.names[0]] == model.engine.model_info.context_window
        one = httpx.get(server.url + "/v1/models/claude-haiku-4-5", headers=headers).json()
        assert one["max_input_tokens"] == windows["little"]

        import anthropic

        client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)
        reply = client.messages.create(
            model="claude-haiku-4-5", max_tokens=4, messages=[{"role": "user", "content": "t"}]
        )
        assert reply.usage.output_tokens >= 1
        stats = httpx.get(server.url + "/v1/stats", headers=headers).json()
        assert [(m["model"]["name"], m["role"]) for m in stats["models"]] == [
            ("big", "main"),
            ("little", "small"),
        ]
        small = stats["models"][1]
        assert small["counters"]["requests_completed"] == 1
        assert small["recent"][-1]["model_alias"] == "claude-haiku-4-5"
        assert stats["models"][0]["counters"]["requests_completed"] == 0
        assert small["recent"][-1]["kind"] == "other" and small["recent"][-1]["cache_key"] == ""
        assert stats["counters"] == stats["models"][0]["counters"]  # the top level: main's
        metrics = httpx.get(server.url + "/metrics", headers=headers).text
        assert 'mlxlaunch_model_loaded{model="little",role="small"} 1.0' in metrics
        assert 'mlxlaunch_model_generated_tokens_total{model="big",role="main"} 0.0' in metrics
        # Claude Code's headers class a request: its session's main loop (a prompt of the
        # user's own) and a subagent (its agent id), each under the session's key.
        tool = {"name": "Read", "input_schema": {"type": "object"}}
        for agent in ({}, {"x-claude-code-agent-id": "agent-1"}):
            client.messages.create(
                model="claude-sonnet-4-6", max_tokens=2, system="My own prompt.", tools=[tool],
                messages=[{"role": "user", "content": "t"}],
                extra_headers={"x-claude-code-session-id": "session-9"} | agent,
            )  # fmt: skip
        recent = httpx.get(server.url + "/v1/stats", headers=headers).json()["recent"]
        assert [(r["kind"], r["cache_key"]) for r in recent[-2:]] == [
            ("main", "session-9"),
            ("subagent", "session-9"),
        ]


def test_a_small_model_that_cannot_load_leaves_the_main_one_serving(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    models = model_set(tiny_model_dir, broken)
    with serving(models) as server:
        asyncio.run(models.load())  # the main model's load succeeds: serving goes on
        small = models.models[1]
        assert small.failure is not None and "not-a-model" in small.failure
        events = asyncio.run(collect(models.submit(turn("h", "hi", 3, model="claude-haiku-4"))))
        assert isinstance(events[-1], Done) and events[-1].usage.output_tokens >= 1
        stats = httpx.get(
            server.url + "/v1/stats", headers={"authorization": f"Bearer {TOKEN}"}
        ).json()
        assert stats["models"][1]["failure"] == small.failure
        assert stats["models"][0]["counters"]["requests_completed"] == 1
        listing = httpx.get(
            server.url + "/v1/models", headers={"authorization": f"Bearer {TOKEN}"}
        ).json()
        assert [e["id"] for e in listing["data"]] == ["big"]


def test_a_small_model_that_fails_on_first_request_hands_it_to_the_main_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Loaded lazily (`mlx launch` loads in the background), a broken small model fails at
    its first request: that request, and the tier's next ones, are the main model's."""
    broken = tmp_path / "broken"
    broken.mkdir()
    models = model_set(tiny_model_dir, broken)
    models.start()
    try:
        events = asyncio.run(collect(models.submit(turn("h", "hi", 3, model="little"))))
        assert isinstance(events[-1], Done)
        assert models.models[1].failure is not None
        assert models.route("little") is models.models[0]
    finally:
        models.close()


# --- the main loop first -------------------------------------------------------------------

LONG_PROMPT = " ".join(f"word{i}" for i in range(3000))


async def first_token_after(models: ModelSet | Engine, request: GenerationRequest) -> float:
    started = time.monotonic()
    async for event in models.submit(request):
        if isinstance(event, TextDelta):
            return time.monotonic() - started
    raise AssertionError("no token")


async def main_turn_ttft(
    models: ModelSet | Engine, scripted: ScriptedOutput, side_model: str, side_streams: int
) -> float:
    """The main turn's time to first token while `side_streams` side requests decode."""
    arrivals: list[int] = [0] * side_streams

    async def side(index: int) -> None:
        request = turn(f"side-{index}", f"side {index}", 20_000, model=side_model)
        async for event in models.submit(request):
            if isinstance(event, TextDelta):
                arrivals[index] += 1

    for _ in range(side_streams):
        scripted.enqueue(" ".join(f"w{i}" for i in range(8000)))
    tasks = [asyncio.create_task(side(i)) for i in range(side_streams)]
    try:
        await wait_until(lambda: all(a > 3 for a in arrivals), timeout=120)
        main = turn(f"main-{time.monotonic()}", LONG_PROMPT, 2, model="big", kind="main")
        return await first_token_after(models, main)
    finally:
        for index in range(side_streams):
            models.cancel(f"side-{index}")
        await asyncio.gather(*tasks)


def best_of(runs: int, measure: Any) -> float:
    return min(measure() for _ in range(runs))


@pytest.mark.parametrize("side_on", ["small model", "main model"])
def test_the_main_turn_goes_first_with_four_side_streams(
    medium_model_dir: Path, tiny_model_dir: Path, side_on: str
) -> None:
    """Issue 31's goal: the main turn's TTFT with 4 side streams running is at most 2x its
    TTFT alone (same run), whether the side streams run on the small model or on the main
    one (then the main prompt prefills in full chunks: `PrefillPacer.plan(urgent=True)`).
    Best of three each, so a preempted run on a busy machine does not decide."""
    scripted = ScriptedOutput()
    config = {"logits_hook": scripted, "cache_memory_bytes": 0, "speculate": "off"}
    models = model_set(medium_model_dir, tiny_model_dir, **config)
    models.start()
    try:
        asyncio.run(models.load())
        side_model = "little" if side_on == "small model" else "big"

        def alone() -> float:
            request = turn(f"alone-{time.monotonic()}", LONG_PROMPT, 2, model="big", kind="main")
            return asyncio.run(first_token_after(models, request))

        def busy() -> float:
            return asyncio.run(main_turn_ttft(models, scripted, side_model, 4))

        alone_s = best_of(3, alone)
        busy_s = best_of(3, busy)
        print(
            f"main-turn TTFT alone {alone_s:.3f} s, with 4 side streams on the {side_on} "
            f"{busy_s:.3f} s ({busy_s / alone_s:.2f}x)"
        )
        assert busy_s <= 2.0 * alone_s
    finally:
        models.close()


def test_a_side_request_waits_behind_a_main_one_for_a_slot(tiny_model_dir: Path) -> None:
    """With every batch slot taken, the next main-loop request starts before side requests
    that queued earlier."""
    scripted = ScriptedOutput()
    engine = Engine(
        EngineConfig(model=str(tiny_model_dir), logits_hook=scripted, max_concurrency=1)
    )
    engine.start()
    try:
        asyncio.run(engine.load())
        order: list[str] = []

        async def scenario() -> None:
            scripted.enqueue(" ".join(f"w{i}" for i in range(300)))
            hog = asyncio.create_task(collect(engine.submit(turn("hog", "hog", 400))))
            await wait_until(lambda: engine.stats().running == 1)

            async def one(request_id: str, kind: RequestKind) -> None:
                async for event in engine.submit(turn(request_id, request_id, 2, kind=kind)):
                    if isinstance(event, TextDelta):
                        order.append(request_id)
                        return

            side = [asyncio.create_task(one(f"side{i}", "title")) for i in range(2)]
            await wait_until(lambda: engine.stats().queue_depth == 2)
            main = asyncio.create_task(one("main", "main"))
            await wait_until(lambda: engine.stats().queue_depth == 3)
            engine.cancel("hog")
            await asyncio.gather(hog, main, *side)

        asyncio.run(scenario())
        assert order[0] == "main", order
    finally:
        engine.close()


def test_serving_loads_the_small_model_beside_the_main_one(tiny_model_dir: Path) -> None:
    """`serving(small_model=…)` (what `mlx serve|launch claude --small-model` call) builds
    the set: the small model by name, Claude Code's haiku id routed to it."""
    from rich.console import Console

    from mlxlaunch.launch.models import ChosenModel
    from mlxlaunch.launch.options import EngineOptions
    from mlxlaunch.launch.serving import serving as served

    chosen = ChosenModel("tiny", tiny_model_dir, "--model")
    settings = ServerSettings(auth_token=TOKEN, model_id="tiny")
    console = Console(quiet=True)

    def serving_with(small: str) -> Any:
        return served(
            chosen, EngineOptions(), settings, kind="serve", console=console, small_model=small
        )

    with serving_with("small") as now:
        roles = [(m.role, m.names[0]) for m in now.engine.models]
        assert roles == [("main", "tiny"), ("small", "small")]
        assert now.engine.route(now.client.small_model_id).role == "small"
        assert now.engine.route(now.client.model_id).role == "main"
        assert now.engine.models[1].failure is None
    with serving_with("no-such-model-anywhere") as now:
        failed = now.engine.models[1]
        assert failed.failure is not None and "no-such-model-anywhere" in failed.failure
        assert now.engine.route(now.client.small_model_id).role == "main"


def test_the_small_model_drafts_for_the_main_one_on_the_same_weights() -> None:
    """`--speculate draft --small-model S` (no --draft-model): S serves the haiku tier and
    drafts for the main model, from one copy of its weights; its drafts are accepted (the
    hand-wired copy models follow one chain) and the main model's output is the plain one."""
    from rich.console import Console

    from mlxlaunch.launch.models import ChosenModel
    from mlxlaunch.launch.options import EngineOptions
    from mlxlaunch.launch.serving import serving as served
    from mlxlaunch.testing import ensure_test_model

    main_dir = ensure_test_model("copy")
    chosen = ChosenModel("copy", main_dir, "--model")
    settings = ServerSettings(auth_token=TOKEN, model_id="copy")
    request = turn("spec", "Say something.", 120, model="copy")
    with served(
        chosen,
        EngineOptions(speculate="draft"),
        settings,
        kind="serve",
        console=Console(quiet=True),
        small_model="copy-tiny",
    ) as now:
        main, small = (m.engine for m in now.engine.models)
        assert main is not None and small is not None
        drafted = asyncio.run(collect(now.engine.submit(request)))
        draft = main._worker.speculation.draft
        assert draft is not None
        assert small._worker.loaded is not None
        assert draft.model is small._worker.loaded.base_model  # the same weights, not a copy
        done = drafted[-1]
        assert isinstance(done, Done)
        assert done.timings.drafted_tokens >= 10
        assert done.timings.accepted_tokens >= 0.9 * done.timings.drafted_tokens
    plain = Engine(EngineConfig(model=str(main_dir), speculate="off"))
    plain.start()
    try:
        assert text_of(asyncio.run(collect(plain.submit(request)))) == text_of(drafted)
    finally:
        plain.close()


# --- models on demand ------------------------------------------------------------------------


def weights_of(directory: Path) -> int:
    from mlxlaunch.store.facts import weights_size

    return weights_size(directory)


def test_a_downloaded_model_a_request_names_is_loaded_beside_the_others(
    tiny_model_dir: Path, small_model_dir: Path, medium_model_dir: Path
) -> None:
    """Loaded on first request, served by its own engine; the least recently used idle one
    closed to make room within the budget; a pinned model never; an id that names a model
    one could pull is a 404 saying how; any other id stays the main model's."""
    on_disk = {"extra-a": small_model_dir, "extra-b": medium_model_dir, "qwen3-4b": "missing"}
    finder_calls: list[str] = []

    def finder(model_id: str) -> Any:
        finder_calls.append(model_id)
        return on_disk.get(model_id)

    budget = weights_of(tiny_model_dir) + max(
        weights_of(small_model_dir), weights_of(medium_model_dir)
    )
    models = ModelSet(
        [ServedModel(EngineConfig(model=str(tiny_model_dir)), names=("main",))],
        finder=finder,
        memory_budget=budget + 1024,
    )
    with serving(models) as server:
        import anthropic

        client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)

        def ask(model: str) -> Any:
            return client.messages.create(
                model=model, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
            )

        assert ask("extra-a").model == "extra-a"
        roles = [(m.names[0], m.role, m.pinned) for m in models.models]
        assert roles == [("main", "main", True), ("extra-a", "extra", False)]
        stats = models.stats()
        assert stats.models[1].counters.requests_completed == 1
        assert stats.models[0].counters.requests_completed == 0
        ask("extra-a")  # served by the loaded one: the store is not asked again
        assert finder_calls.count("extra-a") == 1
        # A second one does not fit beside the first: the idle, least recently used goes.
        ask("extra-b")
        assert [m.names[0] for m in models.models] == ["main", "extra-b"]
        # Claude Code's ids are no models' names: the main model serves them, nothing loads.
        ask("claude-sonnet-4-6")
        assert len(models.models) == 2
        assert models.stats().models[0].counters.requests_completed == 1
        with pytest.raises(anthropic.NotFoundError) as refused:
            ask("qwen3-4b")
        assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        assert "mlx models pull qwen3-4b" in refused.value.message

        import openai

        oai = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            oai.chat.completions.create(
                model="qwen3-4b", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
            )
    # A budget that holds only the pinned model: nothing is loaded, nothing pinned is closed.
    tight = ModelSet(
        [ServedModel(EngineConfig(model=str(tiny_model_dir)), names=("main",))],
        finder=finder,
        memory_budget=weights_of(tiny_model_dir) + 1024,
    )
    with serving(tight) as server:
        reply = httpx.post(
            server.url + "/v1/messages",
            headers={"authorization": f"Bearer {TOKEN}"},
            json={
                "model": "extra-a",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        assert reply.status_code == 503 and "does not fit" in reply.json()["error"]["message"]
        assert [m.names[0] for m in tight.models] == ["main"]


def test_the_store_says_what_an_id_names(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxlaunch.launch.serving import find_in_store
    from mlxlaunch.store.registry import register_local

    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    register_local("my-model", tiny_model_dir)
    assert find_in_store("my-model") == tiny_model_dir.resolve()
    assert find_in_store("qwen3-4b") == "missing"  # a catalog alias, not downloaded
    assert find_in_store("mlx-community/Some-Model-4bit") == "missing"
    assert find_in_store("claude-haiku-4-5") is None
    assert find_in_store("tiny") is None  # the test models are no client's to load
    assert find_in_store(str(tiny_model_dir)) is None  # nor the server's directories


def test_each_model_unloads_on_its_own_keep_alive(
    tiny_model_dir: Path, small_model_dir: Path
) -> None:
    """The small model idles out while the main one decodes (one MLX thread runs both): its
    own sweeper unloads it, the main model stays loaded and its stream goes on; the next
    haiku-tier request loads the small model again."""
    scripted = ScriptedOutput()
    models = ModelSet(
        [
            ServedModel(
                EngineConfig(model=str(small_model_dir), logits_hook=scripted), names=("big",)
            ),
            ServedModel(
                EngineConfig(model=str(tiny_model_dir), keep_alive_s=0.3, sweep_poll_s=0.05),
                names=("little",),
                role="small",
            ),
        ]
    )
    models.start()
    try:
        asyncio.run(models.load())

        async def scenario() -> None:
            scripted.enqueue(" ".join(f"w{i}" for i in range(4000)))
            tokens = 0

            async def main_stream() -> None:
                nonlocal tokens
                async for event in models.submit(turn("main", "go", 5000, model="big")):
                    if isinstance(event, TextDelta):
                        tokens += 1

            task = asyncio.create_task(main_stream())
            await wait_until(lambda: tokens > 5, timeout=60)
            await collect(models.submit(turn("t1", "title", 3, model="little")))
            # (It may have idled out already while the main model loaded: it loads first.)
            unloads = models.stats().models[1].counters.idle_unloads

            def small_state() -> str:
                return models.stats().models[1].state

            await wait_until(lambda: small_state() == "unloaded", timeout=30)
            seen = tokens
            main_now = models.stats().models[0]
            assert main_now.state == "loaded" and main_now.running == 1
            assert models.stats().models[1].counters.idle_unloads == unloads + 1
            await wait_until(lambda: tokens > seen + 5, timeout=30)  # the stream goes on
            again = await collect(models.submit(turn("t2", "title", 3, model="little")))
            assert isinstance(again[-1], Done) and small_state() == "loaded"
            models.cancel("main")
            await task

        asyncio.run(scenario())
    finally:
        models.close()
