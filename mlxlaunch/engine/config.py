"""Engine configuration: which model, how much work at once, and test seams."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxlaunch.engine.types import GenerationRequest

# A logits processor as mlx-lm calls it: (tokens so far, logits) -> logits.
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
LogitsHook = Callable[[GenerationRequest, Any], Sequence[LogitsProcessor] | None]
ModelWrapper = Callable[[nn.Module], nn.Module]


def _on_gpu() -> bool:
    return bool(mx.default_device().type == mx.DeviceType.gpu)


def default_max_concurrency() -> int:
    """Sequences decoded together: a GPU amortises weights over more of them than a CPU."""
    return 8 if _on_gpu() else 4


def default_prefill_chunk() -> int:
    """Prefill step size: on CPU, 256–512-token chunks beat 2,048 at long contexts (FACTS.md)."""
    return 2048 if _on_gpu() else 512


@dataclass
class EngineConfig:
    """How the engine loads and serves one model.

    Args:
        model: a local model directory or a hub id (names and aliases are resolved above).
        context_length: override of the model's context window, in tokens.
        max_concurrency: requests decoded in one batch; more wait in the queue.
        prefill_chunk: prompt tokens processed per step, interleaved with decode steps.
        max_queue: waiting requests beyond which `submit` raises Overloaded.
        max_queued_tokens: waiting prompt tokens beyond which `submit` raises Overloaded.
        logits_hook: test seam; returns extra logits processors for a request.
        model_wrapper: test seam; wraps the loaded model (e.g. to inject failures).
        clock: monotonic clock used for timings.
    """

    model: str
    context_length: int | None = None
    max_concurrency: int = field(default_factory=default_max_concurrency)
    prefill_chunk: int = field(default_factory=default_prefill_chunk)
    max_queue: int = 64
    max_queued_tokens: int = 1_000_000
    logits_hook: LogitsHook | None = None
    model_wrapper: ModelWrapper | None = None
    clock: Callable[[], float] = time.monotonic
    recent_requests: int = 50  # request records kept for stats()

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be at least 2")
