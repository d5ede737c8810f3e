"""The stats snapshot: the body of `GET /v1/stats` and of each `stats` event of its stream.

One wire type for the server that writes it, `GET /metrics` that exports it, and `mlx dash` and
`mlx ps` that read it (`StatsSnapshot.model_validate_json`), so no reader guesses field names.

Readers are lenient on purpose: unknown fields are ignored and missing ones read as zero or
empty, so a dashboard and a server of neighbouring versions still talk (`version` says which
shape the server meant). The tests validate the server's output with `extra="forbid"` and check
that it sends every field. Nothing here names a filesystem path, and other clients' prompt text
(`CacheMiss.excerpts`) is sent only by a server started with `--debug-cache`; a miss otherwise
says where it happened and carries digests of the text on each side (`CacheMiss.digests`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

STATS_VERSION = 2  # 2: the typed shape below (1 passed the engine's dataclasses through)
STATS_EVENT = "stats"  # the SSE event name of `/v1/stats/stream`

ModelState = Literal["unloaded", "loading", "loaded"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ModelStatus(_Wire):
    """The model being served."""

    name: str | None = None  # what clients call it (an alias or the path's last part), never a path
    state: ModelState = "unloaded"


class MemoryFigures(_Wire):
    """Accelerator memory, as MLX reports it."""

    active_bytes: int = 0
    cache_bytes: int = 0  # held in MLX's buffer cache
    limit_bytes: int = 0  # the limit the engine set (0: none)
    kv_cache_bytes: int = 0  # held by KV caches: the prefix cache's and the running sequences'
    kv_running_bytes: int = 0  # of which the running sequences' (prefilling and decoding)
    kv_bits: int = 16  # bits a cached value is held in (`--kv-bits`; 16: unquantized)


class RequestCounters(_Wire):
    """Totals since the engine started; they never go down."""

    requests_admitted: int = 0
    requests_refused: int = 0  # every refusal before admission, 429s included
    requests_overloaded: int = 0  # refusals by admission control (HTTP 429)
    requests_cancelled: int = 0
    requests_deduplicated: int = 0  # duplicates served from a running generation
    requests_failed: int = 0
    requests_completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    idle_cache_clears: int = 0  # MLX buffer cache cleared by the idle sweeper
    idle_unloads: int = 0  # model unloaded by the idle sweeper (keep-alive ran out)
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for verification
    accepted_tokens: int = 0  # of those, accepted


class RecentRequest(_Wire):
    """One finished request."""

    request_id: str = ""
    kind: str = "other"  # main, subagent, title or other
    model_alias: str = ""  # the model id the client asked for
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    decode_tps: float = 0.0
    outcome: str = ""  # a stop reason, "cancelled" or "failed"
    drafted_tokens: int = 0  # speculative decoding: drafted for this request, and accepted
    accepted_tokens: int = 0
    cache_key: str = ""  # the client's conversation key (Responses `prompt_cache_key`)
    # prefix_hit, partial or fresh: against what the cache held of its prompt ("": not judged)
    cache_reuse: str = ""


class AgentSession(_Wire):
    """One agent session's turns on this model, keyed by its conversation key (Claude Code's
    `x-claude-code-session-id`, Codex's `prompt_cache_key`)."""

    key: str = ""
    turns: int = 0
    prompt_tokens: int = 0  # all its turns together
    cached_tokens: int = 0  # of those, read from the prefix cache
    last_request_id: str = ""
    last_prompt_tokens: int = 0
    last_cached_tokens: int = 0
    last_ttft_s: float = 0.0
    miss_turn: int = 0  # the turn (from 1) of its latest cache miss; 0: none
    miss_request_id: str = ""  # the server-wide latest miss (`cache.last_miss`) may be this one
    miss_prompt_tokens: int = 0
    miss_cached_tokens: int = 0
    miss_reuse: str = ""  # partial (clearly less than the cache held) or fresh (nothing)


class MissDigests(_Wire):
    """Hashes (8 hex digits) of the tokens on each side of a cache miss's divergence.

    Equal digests, equal tokens: two misses at the same text (a timestamp that changes every
    turn) can be told from different ones without the text. They are keyed by the server
    process, so they compare only within one server's life and confirm no guessed text.
    """

    before: str = ""  # the shared tokens just before the divergence
    cached: str = ""  # the earlier prompt's tokens from the divergence on
    request: str = ""  # this request's tokens from the divergence on


class MissExcerpts(_Wire):
    """Prompt text on each side of a cache miss's divergence (a client's own words)."""

    before: str = ""  # shared text just before the divergence
    cached: str = ""  # the earlier prompt's text from the divergence on
    request: str = ""  # this request's text from the divergence on


class CacheMiss(_Wire):
    """Where a request's tokens left the nearest earlier prompt, so reuse stopped there."""

    request_id: str = ""
    kind: str = "other"
    position: int = 0  # first token where the request and the nearest earlier prompt differ
    request_tokens: int = 0
    nearest_tokens: int = 0  # length of the nearest earlier prompt
    cached_tokens: int = 0  # what the request did reuse
    digests: MissDigests = Field(default_factory=MissDigests)
    excerpts: MissExcerpts | None = None  # None unless the server runs with --debug-cache


class CacheFigures(_Wire):
    """The prefix cache: memory and disk tiers, and the latest miss."""

    hit_ratio: float = 0.0  # share of prompt tokens served from the cache
    bytes: int = 0
    budget_bytes: int = 0
    blocks: int = 0
    evictions: int = 0
    lookups: int = 0
    hits: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    disk_loads: int = 0
    disk_saves: int = 0
    disk_rejected: int = 0
    warning: str | None = None  # e.g. a model whose caches can only be reused from snapshots
    last_miss: CacheMiss | None = None


class StatsSnapshot(_Wire):
    """A running server at one moment."""

    version: int = STATS_VERSION
    time: float = 0.0  # server wall clock, seconds since the epoch
    uptime_s: float = 0.0
    model: ModelStatus = Field(default_factory=ModelStatus)
    queue_depth: int = 0  # requests waiting for a batch slot
    queued_tokens: int = 0  # their prompt tokens
    running: int = 0  # requests being prefilled or decoded
    prefill_tps: float = 0.0  # prompt tokens per second over the last few seconds
    decode_tps: float = 0.0  # generated tokens per second (all sequences together), same window
    memory: MemoryFigures = Field(default_factory=MemoryFigures)
    counters: RequestCounters = Field(default_factory=RequestCounters)
    cache: CacheFigures = Field(default_factory=CacheFigures)
    recent: tuple[RecentRequest, ...] = ()  # oldest first
    sessions: tuple[AgentSession, ...] = ()  # agent sessions, the latest active first
    # Several models in one server (`--small-model`, `--model A --model B`): the figures above
    # are the main model's; `models` has every model's own (queue, cache, rates, memory),
    # the main model first. One model: () .
    role: str = "main"  # "main", "small" (Claude Code's haiku tier) or "extra"
    failure: str | None = None  # why this model could not be loaded (its requests go to main)
    models: tuple[StatsSnapshot, ...] = ()
