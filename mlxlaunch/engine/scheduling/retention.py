"""What a finished job leaves behind for the next turn: its KV, and its tokens.

The prefix cache keeps the KV of the prompt and the reply; the renderer keeps the reply's
token ids as the model wrote them (`PromptRenderer.adopt`), so the next turn's prompt, which
renders that reply back, reuses exactly those ids and with them all of that KV. A message
thread's turn is pinned in the cache for its next turn (`GenerationRequest.pin_prefix_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxlaunch.engine.cache.prefix import PrefixCache
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.scheduling.job import Job


def retain_job(job: Job, caches: dict[int, Any], prefix: PrefixCache | None) -> None:
    """Keep a finished or removed job's KV: `{uid: (caches, tokens they hold)}`."""
    if prefix is None:
        return
    main = job.request.kind == "main"
    for held, tokens in caches.values():
        if held and tokens:
            prefix.retain(list(tokens), held, main=main, pin_s=job.request.pin_prefix_s)
            prefix.misses.held(tokens)  # what the next turn is judged against


def adopt_reply(renderer: PromptRenderer, all_tokens: Sequence[int], final_token: int) -> None:
    """A reply that ended its turn: its prompt and tokens, the end-of-turn token included
    (called before the job's Done goes out, so the next turn's render finds them)."""
    tokens = list(all_tokens)
    if not tokens or tokens[-1] != final_token:
        tokens.append(final_token)
    renderer.adopt(tokens)
