"""The load-time warm-up: a tiny throwaway generation that never touches what requests use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from engine_helpers import wait_until
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

import mlxlaunch.engine.scheduling.warmup as warmup_module
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.warmup import warm_up
from mlxlaunch.engine.types import ChatMessage, GenerationRequest
from mlxlaunch.testing.failing import ForwardFailures, fail_forward


@pytest.mark.slow
def test_warm_up_runs_a_prefill_and_a_decode_step(tiny_model_dir: Path) -> None:
    model = load(str(tiny_model_dir))[0]
    failures = ForwardFailures()  # here only to count the forward passes
    elapsed = warm_up(fail_forward(failures)(model), width=2, prefill_chunk=512)
    assert elapsed is not None and elapsed > 0
    assert failures.calls >= 2  # the prompt's prefill, then at least one decode step


def test_warm_up_failure_is_not_fatal() -> None:
    class Broken(nn.Module):
        def __call__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("no")

    assert warm_up(Broken(), width=1, prefill_chunk=64) is None


@pytest.mark.slow
async def test_load_warms_the_unwrapped_model_only(tiny_model_dir: Path) -> None:
    # The wrapped model's forward passes are the requests' alone (tests count them).
    failures = ForwardFailures()
    engine = Engine(EngineConfig(model=str(tiny_model_dir), model_wrapper=fail_forward(failures)))
    engine.start()
    try:
        await engine.load()
        assert failures.calls == 0
    finally:
        engine.close()


@pytest.mark.slow
def test_warm_up_continues_a_given_cache(tiny_model_dir: Path) -> None:
    model = load(str(tiny_model_dir))[0]
    cache = list(make_prompt_cache(model))
    model(mx.array([list(range(40))]), cache=cache)  # a 40-token "restored prefix"
    seen: list[int] = []

    class Recorder(nn.Module):
        def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
            seen.append(int(cache[0].offset.max().item()) + inputs.shape[1])
            return model(inputs, cache=cache, **kwargs)

    warm_up(Recorder(), width=1, prefill_chunk=64, cache=cache, prompt_tokens=5)
    assert seen and seen[0] >= 40 + 4  # the prefill ran on top of the given context


async def two_sessions(engine: Engine) -> None:
    """Two sessions sharing a ~400-token system prompt, one after the other."""
    prompt = "A long system prompt that the next session shares. " * 40
    for session in ("one", "two"):
        request = GenerationRequest(
            messages=[
                ChatMessage(role="system", content=prompt),
                ChatMessage(role="user", content=f"session {session}"),
            ],
            max_tokens=2,
        )
        async for _ in engine.submit(request):
            pass


@pytest.mark.slow
async def test_a_restarted_engine_warms_up_at_the_restored_context(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path)
    first = Engine(config)
    first.start()
    try:
        await two_sessions(first)  # the second reuses the first's prefix: saved to disk
    finally:
        first.close()
    assert list(tmp_path.rglob("*.safetensors"))
    contexts: list[int] = []
    original = warmup_module.warm_up

    def spy(model: nn.Module, **kwargs: object) -> float | None:
        cache = kwargs.get("cache")
        contexts.append(cache[0].offset if isinstance(cache, list) else 0)
        return original(model, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(warmup_module, "warm_up", spy)
    restarted = Engine(config)
    restarted.start()
    try:
        await restarted.load()
        assert contexts[0] == 0 and len(contexts) == 2
        assert contexts[1] > 200  # on top of a private copy of the restored prefix
        cache_stats = restarted.stats().cache
        assert cache_stats is not None and cache_stats.lookups == 0  # no request asked
    finally:
        restarted.close()


@pytest.mark.slow
async def test_prefixes_reach_the_disk_after_a_moment_without_requests(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path))
    engine.start()
    try:
        await two_sessions(engine)  # the second reuses the first's prefix
        assert not list(tmp_path.rglob("*.safetensors"))  # not while a next turn may come
        await wait_until(lambda: bool(list(tmp_path.rglob("*.safetensors"))), timeout=10)
    finally:
        engine.close()
