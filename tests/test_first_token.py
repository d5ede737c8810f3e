"""The first output token, read from mlx-lm's generator as soon as it is sampled."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import mlx.nn as nn
import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.first_token import sampled_first_tokens
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, TextDelta
from mlxlaunch.testing import ScriptedOutput


@pytest.mark.slow
@pytest.mark.parametrize("prompts", [[[5, 6, 7, 8, 9]], [[5, 6, 7, 8, 9], [11, 12, 13]]])
def test_the_token_read_ahead_is_the_one_the_generator_reports(
    tiny_model_dir: Path, prompts: list[list[int]]
) -> None:
    model = load(str(tiny_model_dir))[0]
    generator = BatchGenerator(model, completion_batch_size=4, prefill_batch_size=4)
    uids = generator.insert(prompts, max_tokens=[4] * len(prompts))
    ahead: dict[int, int] = {}
    reported: dict[int, int] = {}
    for _ in range(20):
        prompt_responses, generated = generator.next()
        for response in generated:
            reported.setdefault(response.uid, response.token)
        ended = [p.uid for p in prompt_responses if p.end_of_prompt]
        for uid, token in sampled_first_tokens(generator, ended).items():
            assert uid not in reported  # read a step before the generator hands it out
            ahead[uid] = token
        if len(reported) == len(uids):
            break
    generator.close()
    assert sorted(ahead) == sorted(uids)
    assert ahead == {uid: reported[uid] for uid in uids}


def test_nothing_is_read_from_a_generator_it_does_not_know() -> None:
    assert sampled_first_tokens(object(), [1]) == {}
    assert sampled_first_tokens(object(), []) == {}


@pytest.mark.slow
async def test_the_first_text_does_not_wait_for_the_next_forward_pass(
    tiny_model_dir: Path,
) -> None:
    # The third forward pass (the one after the first token's) blocks until the test has seen
    # the first text. Had the engine waited for the generator to report the token, that text
    # would only come after the third pass: the wait below would time out.
    passes = 0
    first_text_seen = threading.Event()

    def gate(model: nn.Module) -> nn.Module:
        class Gated(nn.Module):
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                nonlocal passes
                passes += 1
                if passes == 3:
                    first_text_seen.wait(timeout=10)
                return model(*args, **kwargs)

        return Gated()

    scripted = ScriptedOutput()
    scripted.enqueue("Hello world, again and again.")
    engine = Engine(
        EngineConfig(model=str(tiny_model_dir), model_wrapper=gate, logits_hook=scripted)
    )
    engine.start()
    try:
        request = GenerationRequest(
            messages=[ChatMessage(role="user", content="Say something.")], max_tokens=6
        )
        events = engine.submit(request)

        async def first_text() -> str:
            async for event in events:
                if isinstance(event, TextDelta):
                    return event.text
            raise AssertionError("no text")

        text = await asyncio.wait_for(first_text(), timeout=5)
        assert text and passes <= 3
        first_text_seen.set()
        async for _ in events:
            pass
    finally:
        first_text_seen.set()
        engine.close()
