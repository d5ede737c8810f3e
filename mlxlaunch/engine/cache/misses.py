"""Why a request missed the prefix cache: where its tokens left the nearest earlier prompt.

The tracker remembers the token streams of recent prompts. A request that continues one of them
(a conversation's next turn) is no miss. A request that diverges from its nearest earlier prompt
before that prompt's end — a changed system prompt, a reordered tool list, a timestamp in an
early message — gets a diagnostic: the position and a short excerpt of the text on each side,
so a user can see what broke reuse.

Runs on the engine's MLX thread (it only touches numpy and the tokenizer's decode).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from mlxlaunch.engine.types import MissReport

# Prompts remembered for comparison.
RECENT_PROMPTS = 16
# Tokens decoded on each side of the divergence for the excerpts.
EXCERPT_TOKENS = 24
# Divergence this close to the start means an unrelated prompt, not a broken prefix.
MIN_SHARED_TOKENS = 16
# Divergence this close to the nearest prompt's end is a conversation moving on: the generation
# prompt's last tokens re-tokenize differently once the assistant's reply follows them.
END_SLACK_TOKENS = 8

Decode = Callable[[list[int]], str]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two 1-D token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if len(differs) else n


class MissTracker:
    """Remembers recent prompts and explains requests that break from them."""

    def __init__(self, decode: Decode, keep: int = RECENT_PROMPTS) -> None:
        self._decode = decode
        self._recent: deque[np.ndarray] = deque(maxlen=keep)
        self.last: MissReport | None = None

    def observe(
        self, tokens: Sequence[int] | np.ndarray, *, cached_tokens: int, request_id: str, kind: str
    ) -> MissReport | None:
        """Compare a new prompt with the recent ones, remember it, and report a miss."""
        request = np.asarray(tokens, dtype=np.int64)
        nearest, shared = None, -1
        for earlier in self._recent:
            common = common_prefix(request, earlier)
            if common > shared:
                nearest, shared = earlier, common
        self._remember(request)
        if nearest is None or shared < MIN_SHARED_TOKENS:
            return None
        # Continuing the nearest prompt (or repeating it) is what a conversation does.
        if shared >= len(nearest) - END_SLACK_TOKENS or shared >= len(request):
            return None
        report = MissReport(
            request_id=request_id,
            kind=kind,
            position=shared,
            request_tokens=len(request),
            nearest_tokens=len(nearest),
            cached_tokens=cached_tokens,
            excerpt_before=self._text(nearest[max(0, shared - EXCERPT_TOKENS) : shared]),
            excerpt_cached=self._text(nearest[shared : shared + EXCERPT_TOKENS]),
            excerpt_request=self._text(request[shared : shared + EXCERPT_TOKENS]),
        )
        self.last = report
        return report

    def _remember(self, request: np.ndarray) -> None:
        # A prompt that extends a remembered one replaces it: the longer one answers for both.
        for i, earlier in enumerate(self._recent):
            if len(earlier) <= len(request) and common_prefix(request, earlier) == len(earlier):
                del self._recent[i]
                break
        self._recent.append(request)

    def _text(self, tokens: np.ndarray) -> str:
        try:
            return self._decode([int(t) for t in tokens])
        except Exception:  # a decode problem must not fail the request it describes
            return ""
