"""Engine lifetime: unloading gives the tokenizer back."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


async def test_unload_releases_the_tokenizer_a_constrained_request_used(
    tiny_model_dir: Path,
) -> None:
    # A keep-alive unload followed by a reload builds a new tokenizer each time; the grammar
    # engine's conversion cache must not keep every old one (and its vocabulary) alive.
    engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_memory_bytes=0))
    try:
        await engine.load()
        request = GenerationRequest(
            messages=[ChatMessage("user", "a number please")],
            max_tokens=8,
            response_schema={"type": "integer"},
        )
        events = [event async for event in engine.submit(request)]
        assert isinstance(events[-1], Done)
        loaded = engine._worker.loaded
        assert loaded is not None
        tokenizer = weakref.ref(loaded.tokenizer)
        del loaded
        await engine.unload()
        gc.collect()
        assert tokenizer() is None, gc.get_referrers(tokenizer())
        # And the engine still serves after the reload.
        again = [event async for event in engine.submit(request)]
        assert isinstance(again[-1], Done)
    finally:
        engine.close()
