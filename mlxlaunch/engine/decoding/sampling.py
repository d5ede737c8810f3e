"""The sampling a request runs with: its own settings over the model's recommended ones.

Each field resolves on its own — the client's value, else the model's (generation_config.json,
`ModelInfo.sampling_defaults`), else `FALLBACK` (mlx-lm's neutral settings) — so a client that
sets only a temperature still gets the model's top_p and top_k.

Temperature 0 is greedy whatever else is set: argmax, through the generator's shared greedy
sampler. A repetition penalty is not part of the sampler but a logits processor, so it applies
to greedy decoding too (as in transformers and vLLM): it changes which token is likeliest, and
the output stays deterministic.

In the batch, samplers and logits processors are per sequence (`BatchGenerator.insert` takes
one of each per prompt). Samplers are shared objects, one per distinct setting, because the
generator samples the whole batch in one call when every sequence has the same sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlxlaunch.engine.types import Sampling
from mlxlaunch.store.generation_config import SamplingDefaults

T = TypeVar("T")


@dataclass(frozen=True)
class ResolvedSampling:
    """The settings a sequence is sampled with, every field decided."""

    temperature: float  # 0: greedy
    top_p: float  # 1 (or 0): off
    top_k: int  # 0: off
    min_p: float  # 0: off
    repetition_penalty: float  # 1: off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


# What a field is when neither the client nor the model sets it: plain sampling from the
# model's distribution, which is what every request got before models' defaults were read.
FALLBACK = ResolvedSampling(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)


def _first(request: T | None, model: T | None, fallback: T) -> T:
    return request if request is not None else model if model is not None else fallback


def resolve_sampling(request: Sampling, model: SamplingDefaults) -> ResolvedSampling:
    """The request's settings, with each unset field taken from the model, then `FALLBACK`."""
    return ResolvedSampling(
        temperature=float(_first(request.temperature, model.temperature, FALLBACK.temperature)),
        top_p=float(_first(request.top_p, model.top_p, FALLBACK.top_p)),
        top_k=int(_first(request.top_k, model.top_k, FALLBACK.top_k)),
        min_p=float(_first(request.min_p, model.min_p, FALLBACK.min_p)),
        repetition_penalty=float(
            _first(
                request.repetition_penalty, model.repetition_penalty, FALLBACK.repetition_penalty
            )
        ),
    )


@lru_cache(maxsize=64)
def _sampler(temperature: float, top_p: float, top_k: int, min_p: float) -> Any:
    return make_sampler(temp=temperature, top_p=top_p, top_k=top_k, min_p=min_p)


def sampler_for(sampling: ResolvedSampling) -> Any | None:
    """The mlx-lm sampler for `sampling`; None when greedy (the generator's own argmax).

    The same settings always give the same object (see the module docstring)."""
    if sampling.greedy:
        return None
    # make_sampler applies top_p only inside (0, 1), min_p only when non-zero, top_k when > 0.
    return _sampler(sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p)


class Stateless:
    """A logits processor that is a pure function of the tokens it is shown (mlx-lm's
    penalties): speculative decoding may show it drafted tokens and drop them again."""

    stateless = True

    def __init__(self, processor: Any) -> None:
        self._processor = processor

    def __call__(self, tokens: Any, logits: Any) -> Any:
        return self._processor(tokens, logits)


def penalty_processors(sampling: ResolvedSampling) -> list[Any]:
    """The logits processors `sampling` asks for (the repetition penalty over mlx-lm's
    default window of the last 20 tokens); empty when it asks for none."""
    if sampling.repetition_penalty == 1.0:
        return []
    made = make_logits_processors(repetition_penalty=sampling.repetition_penalty)
    return [Stateless(processor) for processor in made]
