"""What rank 0 shares with the other ranks: one message per decision that touches the model.

Each is a small frozen dataclass (pickled by `RankGroup.share`), applied by the followers in
the order rank 0 sends them. Only what the other ranks cannot know is sent: the prompt's token
ids and the job's shape, never its text, its grammar or its client.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """Load the model (sharded), set up the prefix cache, warm up."""


@dataclass(frozen=True)
class Unload:
    """Drop the model and everything made from it (the idle sweeper's keep-alive)."""


@dataclass(frozen=True)
class Insert:
    """A job joins the batch: its prompt, how much of it rank 0 holds cached, its budget.

    `own_sampler`: rank 0 samples it with a sampler of its own (not the batch's shared one),
    which changes how the batch calls its samplers, and with it the order of collectives.
    """

    prompt: tuple[int, ...]
    cached_tokens: int
    max_tokens: int
    own_sampler: bool
    main: bool  # the main conversation: its prefix outranks side requests in the cache
    pin_s: float  # a message thread's pin (GenerationRequest.pin_prefix_s)


@dataclass(frozen=True)
class Step:
    """One step of the batch, prefilling at most `prefill_tokens` of each prompt."""

    prefill_tokens: int


@dataclass(frozen=True)
class Remove:
    """Sequences leave the batch before the generator ends them (stop sequence, cancel)."""

    uids: tuple[int, ...]


@dataclass(frozen=True)
class SavePrefixes:
    """Write queued prefixes to disk: `one_step` of work, or all of them."""

    one_step: bool


@dataclass(frozen=True)
class Beat:
    """Nothing to do: an idle rank 0 says it is alive, and learns whether the others are."""


@dataclass(frozen=True)
class Stop:
    """Serving ends: every rank exits."""


Op = Load | Unload | Insert | Step | Remove | SavePrefixes | Beat | Stop
