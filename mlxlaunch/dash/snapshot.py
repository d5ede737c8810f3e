"""The server's stats snapshot (`GET /v1/stats`), as the dashboard reads it.

Parsing is lenient on purpose: the server passes new engine fields through as they are added,
and an older or newer server must not crash the dashboard. Missing fields read as zero/empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _float(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _dict(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RequestRow:
    """One finished request in the recent-requests table."""

    request_id: str
    kind: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    decode_tps: float
    outcome: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRow:
        return cls(
            request_id=str(data.get("request_id") or data.get("id") or "?"),
            kind=str(data.get("kind") or "other"),
            model=str(data.get("model_alias") or data.get("model") or ""),
            prompt_tokens=_int(data, "prompt_tokens"),
            cached_tokens=_int(data, "cached_tokens"),
            output_tokens=_int(data, "output_tokens"),
            ttft_s=_float(data, "ttft_s"),
            decode_tps=_float(data, "decode_tps"),
            outcome=str(data.get("outcome") or ""),
        )


@dataclass(frozen=True)
class StatsSnapshot:
    """One point-in-time view of a running server."""

    model: str | None = None
    state: str = "unloaded"
    queue_depth: int = 0
    running: int = 0
    completed: int = 0
    refused: int = 0  # 429 (overloaded) and prompt-too-long refusals
    overloaded: int | None = None  # 429s alone, when the server counts them apart
    cancelled: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    memory_active_bytes: int = 0
    memory_cache_bytes: int = 0
    cache_hit_ratio: float = 0.0
    cache_bytes: int = 0
    cache_disk_bytes: int = 0
    uptime_s: float = 0.0
    recent: tuple[RequestRow, ...] = ()
    last_miss: Any = None  # the server's latest cache-miss diagnostic, shown as it comes
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def too_busy(self) -> int:
        """The count the dashboard shows as 429s."""
        return self.overloaded if self.overloaded is not None else self.refused

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatsSnapshot:
        """Parse a snapshot; unknown fields are kept in `raw`, missing ones read as zero."""
        counters = _dict(data, "counters")
        cache = _dict(data, "cache")
        recent = data.get("recent")
        rows = (
            [RequestRow.from_json(r) for r in recent if isinstance(r, Mapping)]
            if isinstance(recent, list)
            else []
        )
        overloaded = counters.get("requests_overloaded", counters.get("requests_rate_limited"))
        model = data.get("model")
        return cls(
            model=str(model) if model else None,
            state=str(data.get("state") or "unloaded"),
            queue_depth=_int(data, "queue_depth"),
            running=_int(data, "running"),
            completed=_int(counters, "requests_completed"),
            refused=_int(counters, "requests_refused"),
            overloaded=int(overloaded) if isinstance(overloaded, int | float) else None,
            cancelled=_int(counters, "requests_cancelled"),
            failed=_int(counters, "requests_failed"),
            prompt_tokens=_int(counters, "prompt_tokens"),
            cached_tokens=_int(cache, "cached_tokens") or _int(counters, "cached_tokens"),
            generated_tokens=_int(counters, "generated_tokens"),
            prefill_tps=_float(data, "prefill_tps"),
            decode_tps=_float(data, "decode_tps"),
            memory_active_bytes=_int(data, "memory_active_bytes"),
            memory_cache_bytes=_int(data, "memory_cache_bytes"),
            cache_hit_ratio=_float(cache, "hit_ratio"),
            cache_bytes=_int(cache, "bytes"),
            cache_disk_bytes=_int(cache, "disk_bytes"),
            uptime_s=_float(data, "uptime_s"),
            recent=tuple(rows),
            last_miss=data.get("last_miss"),
            raw=dict(data),
        )


def human_bytes(n: int) -> str:
    """`1536` -> `1.5 KiB`; zero reads as `0 B`."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop always returns


def human_duration(seconds: float) -> str:
    """`75` -> `1m15s`; `3725` -> `1h02m`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
