"""Prefix cache disk tier: reuse across server restarts, and bad files never loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from engine_helpers import AGENT_TOOLS, run
from mlx_lm.models.cache import KVCache

from mlxlaunch.engine.cache.disk import TMP_PREFIX, DiskCache, model_identity
from mlxlaunch.engine.cache.misses import common_prefix
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.stats import CacheFigures as EngineCacheFigures
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    Sampling,
)

SYSTEM = "You are a coding agent for this repository. Use the tools to read and edit. " * 8
TOOLS = AGENT_TOOLS


def first_turn(task: str) -> GenerationRequest:
    messages = [ChatMessage("system", SYSTEM), ChatMessage("user", task)]
    return GenerationRequest(
        messages=messages,
        tools=TOOLS,
        max_tokens=8,
        sampling=Sampling(temperature=0.0),
        kind="main",
    )


def second_turn(task: str) -> GenerationRequest:
    request = first_turn(task)
    request.messages += [
        ChatMessage("assistant", "Reading the file."),
        ChatMessage("user", "It says: def f(x): return x * 2"),
    ]
    return request


def engine_for(model_dir: Path, cache_dir: Path | None, **kw: Any) -> Engine:
    return Engine(
        EngineConfig(model=str(model_dir), cache_dir=cache_dir, cache_block_tokens=16, **kw)
    )


async def run_cold(
    model_dir: Path, cache_dir: Path, request: GenerationRequest
) -> tuple[Done, str, str, EngineCacheFigures]:
    """`request` on a new engine over `cache_dir` (which it must not reuse) and on a plain one
    without any cache: its Done, its text, the plain engine's text and its cache figures."""
    restarted = engine_for(model_dir, cache_dir)
    plain = engine_for(model_dir, None, cache_memory_bytes=0)
    try:
        done, text = await run(restarted, request)
        _, expected = await run(plain, request)
        return done, text, expected, restarted.stats().cache
    finally:
        restarted.close()
        plain.close()


async def first_session(model_dir: Path, cache_dir: Path) -> None:
    """Two turns: the second reuses the first's prompt, which is then saved to disk."""
    engine = engine_for(model_dir, cache_dir)
    try:
        await run(engine, first_turn("Task A: fix the parser."))
        done, _ = await run(engine, second_turn("Task A: fix the parser."))
        assert done.usage.cached_tokens > 0
    finally:
        engine.close()  # pending saves are written before the worker ends


def shared_prefix(model_dir: Path, a: GenerationRequest, b: GenerationRequest) -> int:
    tokenizer = mlx_lm.load(str(model_dir))[1]
    renderer = PromptRenderer(tokenizer)
    ta, tb = renderer.render(a).tokens, renderer.render(b).tokens
    return common_prefix(np.asarray(ta), np.asarray(tb))


def saved_files(cache_dir: Path) -> list[Path]:
    files = cache_dir.glob("*/*")  # the entries' files, not the render-date beside them
    entry = (".json", ".safetensors")
    return sorted(p for p in files if p.suffix in entry and not p.name.startswith(TMP_PREFIX))


@pytest.mark.slow
async def test_a_restarted_engine_serves_a_new_session_from_the_saved_prefix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    await first_session(tiny_model_dir, tmp_path)
    assert [p.suffix for p in saved_files(tmp_path)] == [".json", ".safetensors"]
    assert not list(tmp_path.glob(f"*/{TMP_PREFIX}*"))  # writes are atomic renames

    new_session = first_turn("Task B: speed up the tests.")
    shared = shared_prefix(tiny_model_dir, first_turn("Task A: fix the parser."), new_session)
    restarted = engine_for(tiny_model_dir, tmp_path)
    plain = engine_for(tiny_model_dir, None, cache_memory_bytes=0)
    try:
        await restarted.load()  # warm start: the saved prefix is restored with the model
        assert restarted.stats().cache.disk_loads == 1 and restarted.stats().cache.bytes > 0
        done, text = await run(restarted, new_session)
        _, expected = await run(plain, new_session)
    finally:
        restarted.close()
        plain.close()
    assert shared > 100 and done.usage.cached_tokens == shared
    assert text == expected


@pytest.mark.slow
def test_a_new_server_process_reuses_the_saved_prefix(tiny_model_dir: Path, tmp_path: Path) -> None:
    import asyncio

    asyncio.run(first_session(tiny_model_dir, tmp_path))
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_disk_cache import engine_for, first_turn, run
        from pathlib import Path

        async def main():
            engine = engine_for(Path({str(tiny_model_dir)!r}), Path({str(tmp_path)!r}))
            try:
                done, _ = await run(engine, first_turn("Task C: add logging."))
            finally:
                engine.close()
            print(json.dumps([done.usage.prompt_tokens, done.usage.cached_tokens]))

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    prompt, cached = json.loads(out.stdout.strip().splitlines()[-1])
    shared = shared_prefix(
        tiny_model_dir, first_turn("Task A: fix the parser."), first_turn("Task C: add logging.")
    )
    assert 0 < cached == shared < prompt


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["corrupt", "truncate", "foreign"])
async def test_a_damaged_or_foreign_file_is_removed_and_never_loaded(
    tiny_model_dir: Path, tmp_path: Path, damage: str
) -> None:
    await first_session(tiny_model_dir, tmp_path)
    meta, data = saved_files(tmp_path)
    if damage == "corrupt":  # same size, different bytes: only the checksum tells
        raw = bytearray(data.read_bytes())
        raw[-64:] = bytes(64)
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    else:
        about = json.loads(meta.read_text())
        about["model"] = "another-model"
        meta.write_text(json.dumps(about))

    request = first_turn("Task B: speed up the tests.")
    done, text, expected, figures = await run_cold(tiny_model_dir, tmp_path, request)
    assert done.usage.cached_tokens == 0 and text == expected
    assert figures.disk_loads == 0
    # The damaged entry is gone; what disk holds now is the new session's cold prompt alone.
    assert not meta.exists() and not data.exists()
    assert len(saved_files(tmp_path)) == 2


# --- the disk tier alone ------------------------------------------------------------------


def caches(tokens: int) -> list[KVCache]:
    cache = KVCache()
    cache.keys = mx.random.normal((1, 2, tokens, 8))
    cache.values = mx.random.normal((1, 2, tokens, 8))
    cache.offset = tokens
    return [cache]


def test_the_disk_budget_removes_least_recently_used_entries(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, "model-a", budget_bytes=1 << 30)
    first = disk.save(list(range(64)), caches(64))
    assert first is not None
    disk.budget_bytes = first.nbytes * 2 + first.nbytes // 2  # room for two entries
    second = disk.save(list(range(100, 164)), caches(64))
    assert second is not None
    os.utime(tmp_path / "model-a" / f"{first.key}.json", (1, 1))  # first is the oldest...
    disk.touch(first)  # ...until it is used again
    os.utime(tmp_path / "model-a" / f"{second.key}.json", (1, 1))
    disk.save(list(range(200, 264)), caches(64))
    assert {len(e) for e in disk.entries} == {64} and len(disk.entries) == 2
    assert second.key not in {e.key for e in disk.entries}
    assert disk.nbytes <= disk.budget_bytes


def test_entries_round_trip_and_other_models_are_kept_apart(tmp_path: Path) -> None:
    saved = caches(40)
    disk = DiskCache(tmp_path, "model-a", budget_bytes=1 << 30)
    entry = disk.save(list(range(40)), saved)
    assert entry is not None
    reopened = DiskCache(tmp_path, "model-a", budget_bytes=1 << 30)
    found, shared = reopened.best([*range(30), 7, 7])
    assert found is not None and shared == 30
    loaded = reopened.load(found)
    assert loaded is not None and mx.array_equal(loaded[0].state[0], saved[0].state[0]).item()
    assert DiskCache(tmp_path, "model-b", budget_bytes=1 << 30).entries == []


@pytest.mark.slow
def test_model_identity_follows_weights_not_paths(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((tiny_model_dir / name).read_bytes())
    assert model_identity(copy, ["KVCache"]) == model_identity(tiny_model_dir, ["KVCache"])
    assert model_identity(copy, ["RotatingKVCache"]) != model_identity(copy, ["KVCache"])


@pytest.mark.slow
async def test_warm_start_loads_once_and_an_early_request_waits_for_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mlxlaunch.launch.warm import warm_up_in_background

    await first_session(tiny_model_dir, tmp_path)
    loads: list[int] = []

    def counting(model: Any) -> Any:
        loads.append(1)
        return model

    engine = engine_for(tiny_model_dir, tmp_path, model_wrapper=counting)
    try:
        warm = warm_up_in_background(engine)
        done, _ = await run(engine, first_turn("Task D: tidy up."))  # right away
        warm.join(timeout=30)
    finally:
        engine.close()
    shared = shared_prefix(
        tiny_model_dir, first_turn("Task A: fix the parser."), first_turn("Task D: tidy up.")
    )
    assert len(loads) == 1
    assert done.usage.cached_tokens == shared > 0
