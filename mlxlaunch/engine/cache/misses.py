"""Why a request missed the prefix cache, and how much of what it could reuse it did reuse.

Each request is judged against the nearest sequence the cache was handed; one that breaks from
it gets a `MissRecord` (where, the lengths, digests of the tokens on each side), large losses
are logged. No prompt text is kept unless the server runs with `--debug-cache`.

What is remembered: each prompt at admission, replaced by prompt + output when its request ends
(the cache keeps both). A new request is judged against the nearest of them (longest common
prefix): `prefix_hit` when it reused all that sequence covered, `partial` when clearly less,
`fresh` when nothing (see `classify`).

A request that leaves its nearest sequence before that sequence's end — a changed system
prompt, a reordered tool list, a timestamp in an early message, a template that drops the last
turn's reasoning once the user speaks again — gets a record, so a user can tell where reuse
broke and whether it breaks at the same tokens every turn (equal digests). Records reach
`/v1/stats`, which every client holding the token may read, and the server log; the nearest
sequence is often another client's prompt, so by default they carry no text (issue 19: a miss
showed "…password is hunter2…" to other clients). Excerpts (`EXCERPT_CHARS` on each side) are
decoded only by a tracker made with `excerpts=True` (`EngineConfig.debug_cache`). The digests
are keyed by a random per-process key: they compare within one server's life, and nobody can
check a guessed text against them offline.

The output matters: a generation prompt that opens a think block (`<think>\\n`) ends a few
tokens into the reply the cache also holds, so a next turn that renders that reply differently
loses the whole reply while looking, against the prompt alone, like a conversation moving on.

Runs on the engine's MLX thread (it only touches numpy, hashlib and the tokenizer's decode).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mlxlaunch.engine.stats import MissDigests, MissExcerpts, MissRecord

CacheReuse = Literal["prefix_hit", "partial", "fresh"]

# Sequences remembered for comparison.
RECENT_PROMPTS = 16
# Tokens on each side of the divergence that a digest covers and, under --debug-cache, that
# are decoded for the excerpts, then cut to EXCERPT_CHARS: prompts can be megabytes.
EXCERPT_TOKENS = 24
EXCERPT_CHARS = 80
# A digest: 4 bytes, 8 hex digits; enough to tell a handful of misses apart.
DIGEST_BYTES = 4
# Divergence this close to the start means an unrelated prompt, not a broken prefix.
MIN_SHARED_TOKENS = 16
# Re-tokenising where a rendered turn meets the next one may shift a few tokens (a reply's
# end-of-turn token, whitespace a template strips); a loss up to this is still a full hit.
REUSE_SEAM_TOKENS = 64
# Losses from this many tokens on are logged, not only shown in /v1/stats.
MISS_LOG_TOKENS = 256
# The same divergence (same place, same text before it) is logged at most once in this many seconds.
MISS_LOG_REPEAT_S = 60.0
MISS_LOG_KEYS = 64

Decode = Callable[[list[int]], str]

log = logging.getLogger(__name__)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two 1-D token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if len(differs) else n


def classify(cached_tokens: int, covered_tokens: int) -> CacheReuse:
    """A request's reuse against what its nearest earlier sequence covered of its prompt."""
    if cached_tokens <= 0:
        return "fresh"
    if covered_tokens - cached_tokens <= REUSE_SEAM_TOKENS:
        return "prefix_hit"
    return "partial"


@dataclass(frozen=True)
class ReuseJudgement:
    """How much of what the cache could have given one request it gave.

    `covered_tokens`: the prompt tokens the nearest earlier sequence spans (what a request
    continuing it would reuse; at least one prompt token is always prefilled). Where the
    tracker knows no related sequence, what was reused stands for it.
    """

    request_id: str
    request_tokens: int
    cached_tokens: int
    covered_tokens: int
    miss: MissRecord | None = None

    @property
    def lost_tokens(self) -> int:
        return max(0, self.covered_tokens - self.cached_tokens)

    @property
    def reuse(self) -> CacheReuse:
        return classify(self.cached_tokens, self.covered_tokens)


class MissTracker:
    """Remembers recent sequences the cache holds and explains requests that break from them.

    Args:
        decode: token ids to text, for the excerpts (called only when `excerpts`).
        keep: how many sequences to remember.
        clock: monotonic clock for holding back repeated log lines.
        excerpts: keep the prompt text around a miss in its record and log line (other
            clients' words: only for a server started with `--debug-cache`).
    """

    def __init__(
        self,
        decode: Decode,
        keep: int = RECENT_PROMPTS,
        clock: Callable[[], float] = time.monotonic,
        *,
        excerpts: bool = False,
    ) -> None:
        self._decode = decode
        self._clock = clock
        self.excerpts = excerpts
        self._key = secrets.token_bytes(16)  # digests compare within this process only
        self._recent: deque[np.ndarray] = deque(maxlen=keep)
        self._logged: OrderedDict[tuple[object, ...], tuple[float, int]] = OrderedDict()
        self.last: MissRecord | None = None  # the latest miss, for stats
        self.judged: ReuseJudgement | None = None  # the latest request observed

    def observe(
        self, tokens: Sequence[int] | np.ndarray, *, cached_tokens: int, request_id: str, kind: str
    ) -> MissRecord | None:
        """Judge a new prompt against the remembered sequences, remember it, report a miss."""
        request = np.asarray(tokens, dtype=np.int64)
        nearest, shared = None, -1
        for earlier in self._recent:
            common = common_prefix(request, earlier)
            if common > shared:
                nearest, shared = earlier, common
        self._remember(request)
        covered = cached_tokens
        report = None
        if nearest is not None and shared >= MIN_SHARED_TOKENS:
            covered = max(cached_tokens, min(len(nearest), len(request) - 1))
            # Tokens of the request the nearest sequence spans but does not share.
            if min(len(nearest), len(request)) - shared > REUSE_SEAM_TOKENS:
                report = self._report(request, nearest, shared, cached_tokens, request_id, kind)
                self.last = report
        self.judged = ReuseJudgement(request_id, len(request), cached_tokens, covered, report)
        if self.judged.lost_tokens >= MISS_LOG_TOKENS:
            self._log(self.judged, kind)
        return report

    def held(self, tokens: Sequence[int] | np.ndarray) -> None:
        """The cache now holds `tokens` (a finished request's prompt and output)."""
        if len(tokens):
            self._remember(np.asarray(tokens, dtype=np.int64))

    def reuse_of(self, request_id: str, cached_tokens: int) -> CacheReuse:
        """The judgement of `request_id` when it is the latest observed; else (the cache did
        not look it up) what its reuse alone says."""
        judged = self.judged
        if judged is not None and judged.request_id == request_id:
            return judged.reuse
        return classify(cached_tokens, cached_tokens)

    def _remember(self, sequence: np.ndarray) -> None:
        # A sequence that extends remembered ones replaces them: the longer answers for all.
        # One that a remembered sequence extends (a prompt's snapshot, a retry) adds nothing
        # but recency to it.
        kept = [s for s in self._recent if not _extends(sequence, s)]
        longer = next((s for s in kept if _extends(s, sequence)), None)
        if longer is not None:  # used again: the most recent
            kept = [s for s in kept if s is not longer]
        self._recent.clear()
        self._recent.extend([*kept, sequence if longer is None else longer])

    def _report(
        self,
        request: np.ndarray,
        nearest: np.ndarray,
        shared: int,
        cached_tokens: int,
        request_id: str,
        kind: str,
    ) -> MissRecord:
        before = nearest[max(0, shared - EXCERPT_TOKENS) : shared]
        cached = nearest[shared : shared + EXCERPT_TOKENS]
        ahead = request[shared : shared + EXCERPT_TOKENS]
        excerpts = None
        if self.excerpts:
            excerpts = MissExcerpts(
                before=self._text(before)[-EXCERPT_CHARS:],
                cached=self._text(cached)[:EXCERPT_CHARS],
                request=self._text(ahead)[:EXCERPT_CHARS],
            )
        return MissRecord(
            request_id=request_id,
            kind=kind,
            position=shared,
            request_tokens=len(request),
            nearest_tokens=len(nearest),
            cached_tokens=cached_tokens,
            digests=MissDigests(
                before=self._digest(before),
                cached=self._digest(cached),
                request=self._digest(ahead),
            ),
            excerpts=excerpts,
        )

    def _log(self, judged: ReuseJudgement, kind: str) -> None:
        miss = judged.miss
        # Repeats: the same place of divergence (a timestamp that changes every turn).
        key: tuple[object, ...] = (
            (kind, miss.position, miss.digests.before) if miss is not None else (kind, "shortfall")
        )
        repeats = self._repeats(key)
        if repeats is None:
            return
        # A main conversation that re-prefills most of its prompt is what a user must see;
        # side requests and partial losses (a dropped reasoning block) are for the log file.
        most = judged.lost_tokens * 2 >= judged.request_tokens
        level = logging.WARNING if kind == "main" and most else logging.INFO
        again = f" ({repeats} more like it since)" if repeats else ""
        head = (
            f"prefix cache: {judged.request_id} ({kind or 'request'}) reused "
            f"{judged.cached_tokens} of {judged.request_tokens} prompt tokens, "
            f"{judged.lost_tokens} lost"
        )
        if miss is not None:
            d = miss.digests
            where = (
                f"left its nearest earlier prompt at token {miss.position} "
                f"(before #{d.before}, cached #{d.cached}, request #{d.request})"
            )
            if miss.excerpts is not None:  # --debug-cache: the text too, quoted on one line
                e = miss.excerpts
                where += f"; before {e.before!r}, cached {e.cached!r}, request {e.request!r}"
            log.log(level, "%s: %s%s", head, where, again)
        else:
            log.log(
                level,
                "%s: its nearest earlier prompt shared them, the cache no longer held them "
                "(evicted, or that request had not finished)%s",
                head,
                again,
            )

    def _repeats(self, key: tuple[object, ...]) -> int | None:
        """None if `key` was logged within MISS_LOG_REPEAT_S (counted); else how many were
        held back since it was last logged."""
        now = self._clock()
        seen = self._logged.get(key)
        if seen is not None and now - seen[0] < MISS_LOG_REPEAT_S:
            self._logged[key] = (seen[0], seen[1] + 1)
            return None
        self._logged[key] = (now, 0)
        self._logged.move_to_end(key)
        while len(self._logged) > MISS_LOG_KEYS:
            self._logged.popitem(last=False)
        return seen[1] if seen is not None else 0

    def _digest(self, tokens: np.ndarray) -> str:
        """The keyed digest of a token window (its ids, so nothing is decoded for it)."""
        data = np.ascontiguousarray(tokens, dtype="<i8").tobytes()
        return hashlib.blake2b(data, digest_size=DIGEST_BYTES, key=self._key).hexdigest()

    def _text(self, tokens: np.ndarray) -> str:
        try:
            return self._decode([int(t) for t in tokens])
        except Exception:  # a decode problem must not fail the request it describes
            return ""


def _extends(longer: np.ndarray, shorter: np.ndarray) -> bool:
    n = len(shorter)
    if n > len(longer) or (n and longer[n - 1] != shorter[n - 1]):
        return False  # the cheap answer for most pairs, before comparing whole prompts
    return common_prefix(longer, shorter) == n
