"""The physical limits, measured in this process with mlx-lm and no server at all.

- Decode ceiling: `mlx_lm.stream_generate` on the decode workload's prompt.
- Prefill floor: for each prompt in order, the time to prefill only the tokens it does not share
  with the one before (its new suffix, at its context length) and pick the first token.

A server cannot beat these; its figures are read against them. Everything runs on the calling
thread, before any in-process server starts, so the MLX work never overlaps.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx

from mlxlaunch.bench.wire import TEMPERATURE, openai_messages, openai_tools
from mlxlaunch.bench.workloads import Conversation, tool_result_text


@dataclass
class FloorSample:
    """Prefill of one prompt's new suffix, given the previous prompt already in the cache."""

    label: str
    prompt_tokens: int
    reused_tokens: int
    seconds: float

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


@dataclass
class CeilingSample:
    """One in-process decode run: arrival time of every token (seconds from the call)."""

    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)


def render(tokenizer: Any, conversation: Conversation) -> list[int]:
    """The prompt tokens of `conversation` through the model's chat template."""
    tools = openai_tools(conversation.tools) or None
    tokens = tokenizer.apply_chat_template(
        openai_messages(conversation, arguments_as_json=False),
        tools=tools,
        add_generation_prompt=True,
        enable_thinking=conversation.thinking,
    )
    return list(tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class InProcessModel:
    """A model loaded with mlx-lm in this process, for ceiling and floor measurements."""

    def __init__(
        self, model_dir: str, *, prefill_chunk: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        from mlx_lm import load

        self.model, self.tokenizer = load(model_dir)[:2]
        self.prefill_chunk = prefill_chunk
        self._clock = clock
        self._warm_up()

    def _warm_up(self) -> None:
        # First calls compile kernels and allocate; keep that out of every measurement.
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        mx.eval(self.model(mx.array([[1, 2, 3, 4]]), cache=cache))

    def _prefill(self, tokens: Sequence[int], cache: list[Any]) -> int:
        """Run `tokens` through the model into `cache`; return the greedy next token.

        Only the last position's logits are computed: the others are never needed, and on a
        CPU the output projection over every prompt position can cost more than attention.
        """
        body, last = tokens[:-1], tokens[-1:]
        for start in range(0, len(body), self.prefill_chunk):
            chunk = mx.array([list(body[start : start + self.prefill_chunk])])
            self.model(chunk, cache=cache)  # lazily; evaluating the cache skips the logits
            mx.eval([c.state for c in cache])
        logits = self.model(mx.array([list(last)]), cache=cache)
        first = mx.argmax(logits[0, -1, :])
        mx.eval(first)
        return cast(int, first.item())

    def prefill_floor(
        self, prompts: Sequence[tuple[str, Conversation]], on_done: Callable[[], None] | None = None
    ) -> list[FloorSample]:
        """Time the prefill of each prompt's new suffix, in order, reusing one KV cache."""
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        cache = make_prompt_cache(self.model)
        cached: list[int] = []
        samples = []
        for label, conversation in prompts:
            tokens = render(self.tokenizer, conversation)
            # At least one token must run to produce the first output token.
            reused = min(common_prefix(cached, tokens), len(tokens) - 1)
            if len(cached) > reused:
                trim_prompt_cache(cache, len(cached) - reused)
            start = self._clock()
            self._prefill(tokens[reused:], cache)
            samples.append(FloorSample(label, len(tokens), reused, self._clock() - start))
            cached = tokens
            if on_done:
                on_done()
        return samples

    def decode_ceiling(self, conversation: Conversation, max_tokens: int) -> CeilingSample:
        """Decode `max_tokens` with `mlx_lm.stream_generate`, sampling as the servers do,
        timing every token."""
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        tokens = render(self.tokenizer, conversation)
        sample = CeilingSample(prompt_tokens=len(tokens))
        sampler = make_sampler(temp=TEMPERATURE)
        start = self._clock()
        for _ in stream_generate(
            self.model, self.tokenizer, tokens, max_tokens=max_tokens, sampler=sampler
        ):
            sample.token_times.append(self._clock() - start)
        return sample

    def chars_per_token(self) -> float:
        """Characters per token of this tokenizer on the stream prompts' kind of text."""
        sample = tool_result_text(0, 20_000)
        return len(sample) / max(1, len(self.tokenizer.encode(sample, add_special_tokens=False)))

    def close(self) -> None:
        """Drop the weights and MLX's buffer cache before the servers start."""
        del self.model, self.tokenizer
        gc.collect()
        mx.clear_cache()
