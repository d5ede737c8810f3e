"""A request's first output token, read the moment it exists.

mlx-lm's `GenerationBatch` samples a sequence's first token as its prompt ends, but hands it
out only from the following `next()`, after that call has issued the forward pass of the token
after it (it pipelines one step ahead). On the CPU backend `async_eval` does that work before
returning, so waiting for the generator would add a whole decode step to every time to first
token. The worker reads the sampled token here instead, and skips it when the generator
reports it a step later (see `Worker._step`).

The generator's private state is read in `runtime/mlx_lm_internals.py`; when that state is not
where it is expected (another mlx-lm version), nothing comes back and the worker simply waits as
before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mlxlaunch.engine.runtime.mlx_lm_internals import pending_first_tokens


def sampled_first_tokens(generator: Any, uids: Collection[int]) -> dict[int, int]:
    """The sampled, not yet reported, next token of each of `uids` in the generation batch."""
    if not uids:
        return {}
    wanted = set(uids)
    return {uid: token for uid, token in pending_first_tokens(generator).items() if uid in wanted}
