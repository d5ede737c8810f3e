"""The load-time warm-up: a tiny throwaway generation that never touches what requests use."""

from __future__ import annotations

from pathlib import Path

import mlx.nn as nn
from mlx_lm import load

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.warmup import warm_up
from mlxlaunch.testing.failing import ForwardFailures, fail_forward


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
