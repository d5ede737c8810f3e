"""A request's first output token, read the moment it exists.

mlx-lm's `GenerationBatch` samples a sequence's first token as its prompt ends, but hands it
out only from the following `next()`, after that call has issued the forward pass of the token
after it (it pipelines one step ahead). On the CPU backend `async_eval` does that work before
returning, so waiting for the generator would add a whole decode step to every time to first
token. The worker reads the sampled token here instead, and skips it when the generator
reports it a step later (see `Worker._step`).

This reaches into the generator's private state; when that state is not where it is expected
(another mlx-lm version), it returns nothing and the worker simply waits as before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def sampled_first_tokens(generator: Any, uids: Collection[int]) -> dict[int, int]:
    """The sampled, not yet reported, next token of each of `uids` in the generation batch."""
    if not uids:
        return {}
    batch = getattr(generator, "_generation_batch", None)
    members = getattr(batch, "uids", None)
    pending = getattr(batch, "_next_tokens", None)
    if not isinstance(members, list) or pending is None:
        return {}
    try:
        tokens = pending.tolist()  # waits for the sampling (on a GPU, only for it)
    except Exception:
        return {}
    if not isinstance(tokens, list) or len(tokens) != len(members):
        return {}
    wanted = set(uids)
    return {
        uid: int(token)
        for uid, token in zip(members, tokens, strict=True)
        if uid in wanted and isinstance(token, int)
    }
