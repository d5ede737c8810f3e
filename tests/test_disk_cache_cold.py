"""The disk tier keeps a session's cold first prompt, so the next process's first session
starts warm: written after the answer, a step at a time, only while the engine is idle."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from cli_process import reaped, stop
from deadlines import PROCESS_START_S
from engine_helpers import FakeClock, collect, run, wait_until
from mlx_lm.models.cache import KVCache, RotatingKVCache, load_prompt_cache, save_prompt_cache
from test_serve_cli import _read_announcement

from mlxlaunch.engine.cache import disk as disk_module
from mlxlaunch.engine.cache.disk import TMP_PREFIX, DiskCache, EntryWriter
from mlxlaunch.engine.cache.misses import common_prefix
from mlxlaunch.engine.cache.prefix import MIN_DISK_TOKENS, CacheSettings, PrefixCache
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.scheduling.worker import SAVE_AFTER_IDLE_S
from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest, Sampling, ToolSpec

# A system prompt and a dozen tools, identical across sessions as Claude Code's are.
SYSTEM = " ".join(
    f"Rule {i}: read the code before editing it, keep changes small, run the tests, and say "
    f"what changed and why in plain words (case {i * 7 % 13})."
    for i in range(40)
)
CLAUDE_CODE_REQUEST = Path(__file__).parent / "fixtures/claude-code-2.1.332/print-mode-request.json"
TOOL_NAMES = ("Bash", "Read", "Edit", "Write", "Glob", "Grep", "WebFetch", "WebSearch")
TOOL_NAMES += ("TodoWrite", "Task", "NotebookEdit", "ExitPlanMode")
TOOLS = [
    ToolSpec(
        name,
        f"{name}: a tool of the coding agent, used as its description says.",
        {"type": "object", "properties": {"path": {"type": "string"}, "limit": {}}},
    )
    for name in TOOL_NAMES
]


def first_turn(task: str) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("system", SYSTEM), ChatMessage("user", task)],
        tools=TOOLS,
        max_tokens=8,
        sampling=Sampling(temperature=0.0),
        kind="main",
    )


def engine_on(model_dir: Path, cache_dir: Path | None, **kw: Any) -> Engine:
    return Engine(EngineConfig(model=str(model_dir), cache_dir=cache_dir, **kw))


def prompt_tokens(model_dir: Path, request: GenerationRequest) -> list[int]:
    return list(PromptRenderer(mlx_lm.load(str(model_dir))[1]).render(request).tokens)


def after_idle_time(clock: FakeClock, condition: Callable[[], bool]) -> Callable[[], bool]:
    """`condition`, polled with the clock moved on each time: the worker's idle time starts
    when its loop next comes round, which may be after the test saw Done."""

    def check() -> bool:
        clock.advance(SAVE_AFTER_IDLE_S)
        return condition()

    return check


def saved(cache_dir: Path) -> list[Path]:
    """The disk tier's files (entries, and unfinished ones) in `cache_dir`'s identity
    directories (not the weight-digest memo beside them)."""
    files = cache_dir.glob("*/*")
    return sorted(p for p in files if p.suffix in (".json", ".safetensors") and p.is_file())


def saved_prompts(cache_dir: Path) -> list[list[int]]:
    metas = [p for p in saved(cache_dir) if p.suffix == ".json"]
    return [json.loads(p.read_text())["tokens"] for p in metas]


# --- across processes (engines) ----------------------------------------------------------


@pytest.mark.slow
async def test_a_new_process_first_session_reuses_the_last_one_cold_prompt(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    first, second = first_turn("Fix the parser in src/parse.py."), first_turn("Add logging.")
    engine = engine_on(tiny_model_dir, tmp_path)
    try:
        done, _ = await run(engine, first)  # one cold request: the whole session
    finally:
        engine.close()
    assert done.usage.cached_tokens == 0
    ours = prompt_tokens(tiny_model_dir, first)
    assert saved_prompts(tmp_path) == [ours]  # the whole prompt, once answered
    assert not [p for p in saved(tmp_path) if p.name.startswith(TMP_PREFIX)]

    theirs = prompt_tokens(tiny_model_dir, second)
    shared = common_prefix(np.asarray(ours), np.asarray(theirs))
    system_part = prompt_tokens(tiny_model_dir, first_turn(""))  # up to the user's text
    assert shared >= common_prefix(np.asarray(ours), np.asarray(system_part)) > 1000
    assert shared % 256 != 0  # reuse is token-exact, not rounded to the trie's blocks

    restarted = engine_on(tiny_model_dir, tmp_path)
    plain = engine_on(tiny_model_dir, None, cache_memory_bytes=0)
    try:
        await restarted.load()
        assert restarted.stats().cache.disk_loads == 1  # restored from disk at load
        done, text = await run(restarted, second)
        _, expected = await run(plain, second)
    finally:
        restarted.close()
        plain.close()
    assert done.usage.cached_tokens == shared
    assert text == expected
    # The second session reused most of its prompt: it adds no near-copy of the first's.
    assert saved_prompts(tmp_path) == [ours]


@pytest.mark.slow
async def test_the_save_starts_after_the_answer_and_only_when_idle(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    order: list[str] = []

    class SaveStarts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("prefix cache: saving"):
                order.append("save")

    handler = SaveStarts(level=logging.DEBUG)
    logger = logging.getLogger("mlxlaunch.engine.cache.prefix")
    logger.addHandler(handler)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    clock = FakeClock()  # the worker's idle time moves only when the test says
    engine = engine_on(tiny_model_dir, tmp_path, clock=clock)
    try:
        done, _ = await run(engine, first_turn("Fix the parser."))
        order.append("done")
        await asyncio.sleep(0.2)  # the worker is idle now, but not yet for long enough
        assert engine.stats().cache.disk_saves == 0 and saved(tmp_path) == []
        await wait_until(after_idle_time(clock, lambda: engine.stats().cache.disk_saves == 1))
    finally:
        engine.close()
        logger.removeHandler(handler)
    assert done.usage.cached_tokens == 0
    assert order == ["done", "save"]


@pytest.mark.slow
async def test_a_request_that_arrives_during_a_save_goes_first(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    engine = engine_on(tiny_model_dir, tmp_path, clock=clock)
    busy_at_steps: set[tuple[int, int]] = set()  # (running, queued) whenever a step ran
    started, go_on = threading.Event(), threading.Event()
    step = EntryWriter.step

    def watched_step(self: EntryWriter, limit: int | None = None) -> bool:
        figures = engine.stats()
        busy_at_steps.add((figures.running, figures.queue_depth))
        started.set()
        return step(self, limit) if go_on.is_set() else False  # held mid-save by the test

    monkeypatch.setattr(EntryWriter, "step", watched_step)
    try:
        await run(engine, first_turn("Fix the parser."))
        await wait_until(after_idle_time(clock, started.is_set))  # a save is under way...
        events = await asyncio.wait_for(collect(engine.submit(first_turn("Add logging."))), 30)
        assert isinstance(events[-1], Done)  # ...and the new request was served meanwhile
        assert engine.stats().cache.disk_saves == 0
        go_on.set()  # the save resumes once the worker is idle again
        await wait_until(after_idle_time(clock, lambda: engine.stats().cache.disk_saves == 1))
    finally:
        engine.close()
    assert busy_at_steps == {(0, 0)}  # never a step with a request running or waiting


@pytest.mark.slow
async def test_no_disk_budget_keeps_nothing_on_disk(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = engine_on(tiny_model_dir, tmp_path, cache_disk_bytes=0)
    try:
        await run(engine, first_turn("Fix the parser."))  # cold
        await run(engine, first_turn("Fix the parser."))  # reused
        figures = engine.stats().cache
    finally:
        engine.close()
    assert figures.disk_saves == 0 and figures.disk_entries == 0
    assert saved(tmp_path) == []


# --- the prefix cache alone (no model) ---------------------------------------------------


class TwoLayers:
    """Stands in for a model: make_prompt_cache gives it one plain KV cache per layer, and a
    forward pass fills each with 2 heads of 8 (the disk tier reads the layout off it)."""

    layers: tuple[None, ...] = (None, None)

    def __call__(self, tokens: mx.array, cache: list[Any]) -> None:
        kv = mx.zeros((1, 2, tokens.shape[1], 8))
        for layer in cache:
            layer.update_and_fetch(kv, kv)


class Rotating(TwoLayers):
    """A model whose caches cannot be trimmed: the prefix cache keeps snapshots."""

    layers = (None,)

    def make_cache(self) -> list[Any]:
        return [RotatingKVCache(max_size=4096)]


def filled(tokens: int, layers: int = 2) -> list[KVCache]:
    caches = []
    for _ in range(layers):
        cache = KVCache()
        kv = mx.random.normal((1, 2, tokens, 8))
        cache.update_and_fetch(kv, kv + 1)
        caches.append(cache)
    return caches


def prefix_cache(cache_dir: Path, model: Any = None, disk_bytes: int = 1 << 30) -> PrefixCache:
    settings = CacheSettings(memory_bytes=1 << 30, disk_dir=cache_dir, disk_bytes=disk_bytes)
    model_path = str(cache_dir.parent / "model")
    return PrefixCache(model or TwoLayers(), model_path, settings, lambda t: "")


def answered(cache: PrefixCache, prompt: list[int], kind: str = "main") -> int:
    """Admit `prompt`, 'run' it (its cache then holds the prompt and 4 output tokens), keep
    it: what the worker does for a request. Returns the tokens it found cached."""
    plan = cache.plan(prompt, kind=kind)
    cache.retain([*prompt, 1, 2, 3, 4], filled(len(prompt) + 4))
    return plan.cached_tokens


SYSTEM_TOKENS = list(range(1000, 1700))  # 700: not a multiple of the trie's 256-token blocks


def test_a_cold_main_prompt_is_saved_whole_and_a_new_session_reuses_its_shared_part(
    tmp_path: Path,
) -> None:
    first = prefix_cache(tmp_path)
    prompt = [*SYSTEM_TOKENS, 5, 6, 7]
    assert answered(first, prompt) == 0
    assert first.saves_pending
    assert first.save_pending() == 1 and saved_prompts(tmp_path) == [prompt]

    later = prefix_cache(tmp_path)  # a new process on the same directory
    assert later.restore() == 1
    other = [*SYSTEM_TOKENS, 8, 9]
    assert later.plan(other, kind="main").cached_tokens == len(SYSTEM_TOKENS)
    assert not later.saves_pending  # warm: nothing new worth a file


def test_only_a_main_conversations_cold_prompt_is_saved(tmp_path: Path) -> None:
    cache = prefix_cache(tmp_path)
    for i, kind in enumerate(("title", "subagent", "other")):
        answered(cache, list(range(5000 * (i + 1), 5000 * (i + 1) + 700)), kind=kind)
    answered(cache, list(range(MIN_DISK_TOKENS - 10)))  # too short to be worth a file
    assert not cache.saves_pending


def test_the_next_turn_before_the_save_makes_one_longer_entry_not_two(tmp_path: Path) -> None:
    cache = prefix_cache(tmp_path)
    prompt = [*SYSTEM_TOKENS, 5, 6, 7]
    answered(cache, prompt)  # cold: its prompt is queued
    answered(cache, [*prompt, 1, 2, 3, 4, 8, 9])  # reuses it and its answer before any save
    assert cache.save_pending() == 1
    assert saved_prompts(tmp_path) == [[*prompt, 1, 2, 3, 4]]
    answered(cache, [*SYSTEM_TOKENS, 10, 11])  # another session, warm: nothing new to save
    assert not cache.saves_pending


def test_a_request_cancelled_in_its_prefill_saves_what_was_computed(tmp_path: Path) -> None:
    cache = prefix_cache(tmp_path)
    prompt = [*SYSTEM_TOKENS, *range(5, 1000)]
    cache.plan(prompt, kind="main")
    cache.retain(prompt[:600], filled(600))  # the prefill got this far
    assert cache.save_pending() == 1
    assert saved_prompts(tmp_path) == [prompt[:600]]


def test_an_entry_over_the_disk_budget_is_not_written(tmp_path: Path) -> None:
    cache = prefix_cache(tmp_path, disk_bytes=10_000)
    answered(cache, [*SYSTEM_TOKENS, 5])
    assert cache.save_pending() == 0 and saved(tmp_path) == []


def test_snapshot_models_save_reused_prefixes_but_not_cold_prompts(tmp_path: Path) -> None:
    cache = prefix_cache(tmp_path, Rotating())
    prompt = [*SYSTEM_TOKENS, 5]
    snapshot = RotatingKVCache(max_size=4096)
    kv = mx.random.normal((1, 2, len(prompt), 8))
    snapshot.update_and_fetch(kv, kv)
    assert cache.plan(prompt, kind="main").cached_tokens == 0
    cache.retain(prompt, [snapshot])
    assert not cache.saves_pending  # a snapshot serves no other session's first prompt
    assert cache.plan([*prompt, 6, 7], kind="main").cached_tokens == len(prompt)
    assert cache.save_pending() == 1  # the reused snapshot, whole
    assert saved_prompts(tmp_path) == [prompt]


# --- the disk tier alone ------------------------------------------------------------------


def test_a_written_entry_is_the_file_mlx_lm_writes(tmp_path: Path) -> None:
    """A tripwire: entries are laid out here, not by mlx-lm; a change in its prompt-cache
    format fails this before it fails a restore."""
    rotating = RotatingKVCache(max_size=64)
    kv = mx.random.normal((1, 2, 100, 8)).astype(mx.bfloat16)
    rotating.update_and_fetch(kv, kv)
    caches = [*filled(300, layers=1), rotating]
    disk = DiskCache(tmp_path, "model-a", 1 << 30)
    entry = disk.save(list(range(300)), caches)
    assert entry is not None
    ours = tmp_path / "model-a" / f"{entry.key}.safetensors"
    theirs = tmp_path / "theirs.safetensors"
    save_prompt_cache(str(theirs), caches, {"model": "model-a", "tokens": "300"})
    our_arrays, our_meta = mx.load(str(ours), return_metadata=True)
    their_arrays, their_meta = mx.load(str(theirs), return_metadata=True)
    assert our_meta == their_meta and our_arrays.keys() == their_arrays.keys()
    for name, array in their_arrays.items():
        assert our_arrays[name].dtype == array.dtype
        assert mx.array_equal(our_arrays[name], array).item()
    loaded = load_prompt_cache(str(ours))
    assert [type(c) for c in loaded] == [KVCache, RotatingKVCache]
    assert loaded[1].max_size == 64 and loaded[0].offset == 300


def test_an_entry_is_written_in_bounded_steps_and_exists_only_when_complete(
    tmp_path: Path,
) -> None:
    disk = DiskCache(tmp_path, "model-a", 1 << 30)
    writer = disk.begin(list(range(1000)), filled(1000))
    assert writer is not None and writer.nbytes > 40 * 4096
    sizes = []
    while not writer.step(4096):
        (tmp,) = (tmp_path / "model-a").glob(f"{TMP_PREFIX}*")
        sizes.append(tmp.stat().st_size)
        assert DiskCache(tmp_path, "model-a", 1 << 30).entries == []  # not yet an entry
    growth = np.diff(sizes)
    assert len(sizes) > 40 and growth.max() <= 4096
    entry = writer.entry
    assert entry is not None and entry.nbytes == writer.nbytes
    reopened = DiskCache(tmp_path, "model-a", 1 << 30)
    loaded = reopened.load(reopened.entries[0])
    assert loaded is not None and loaded[1].offset == 1000


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskCache(tmp_path, "model-a", 1 << 30)
    writer = disk.begin(list(range(500)), filled(500))
    assert writer is not None and not writer.step(4096)

    def full_disk(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module, "_write_atomically", full_disk)
    while not writer.step():
        pass
    assert writer.entry is None and disk.entries == []
    assert saved(tmp_path) == []


# --- across real server processes ---------------------------------------------------------


def claude_code_first_turn(message: str) -> dict[str, Any]:
    """Claude Code's first request of a session (`claude -p`), asking `message`."""
    body = json.loads(CLAUDE_CODE_REQUEST.read_text())["body"]
    first = body["messages"][0]["content"]
    assert first[-1]["text"] == "say hi"
    first[-1]["text"] = message
    return {**body, "stream": False, "max_tokens": 4}


def serve_once(model_dir: Path, cache_dir: Path, body: dict[str, Any]) -> dict[str, Any]:
    """Start `mlx serve`, send `body`, stop it with Ctrl-C; the response's usage."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_AUTH_TOKEN", None)
    command = [sys.executable, "-m", "mlxlaunch", "serve", "--model", str(model_dir)]
    started = subprocess.Popen(
        [*command, "--port", "0", "--cache-dir", str(cache_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    with reaped(started) as proc:
        url, token, _ = _read_announcement(proc, time.monotonic() + PROCESS_START_S)
        response = httpx.post(
            url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=120
        )
        assert response.status_code == 200, response.text
        err = stop(proc)
    assert proc.returncode in (0, 130), err
    usage: dict[str, Any] = response.json()["usage"]
    return usage


@pytest.mark.slow
def test_a_restarted_server_starts_claude_codes_next_session_warm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    first = serve_once(tiny_model_dir, tmp_path, claude_code_first_turn("say hi"))
    assert first["cache_read_input_tokens"] == 0 and len(saved_prompts(tmp_path)) == 1
    second = serve_once(
        tiny_model_dir, tmp_path, claude_code_first_turn("Explain what this repository does.")
    )
    # The system prompt and tools came from disk; what follows the user's text (their new
    # message, then the ~9k-character system message Claude Code sends after it) was prefilled.
    cached, prefilled = second["cache_read_input_tokens"], second["input_tokens"]
    assert cached > 10_000 and cached > 4 * prefilled
