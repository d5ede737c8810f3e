"""Statistics over measured samples: percentiles and summaries. Pure functions, no timing."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`-th percentile (0–100) by linear interpolation between closest ranks.

    Same definition as numpy's default ("linear"): rank = p/100 · (n − 1).
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, min, max and p50/p90/p99 of `values` (an empty dict for no values)."""
    if not values:
        return {}
    return {
        "n": float(len(values)),
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def intervals(times: Sequence[float]) -> list[float]:
    """Differences between consecutive timestamps (inter-token latencies)."""
    return [b - a for a, b in itertools.pairwise(times)]


def decode_rate(times: Sequence[float], tokens: int) -> float | None:
    """Decode tokens per second from the first to the last token's arrival.

    The first token belongs to prefill, so `tokens − 1` tokens are decoded in that span.
    None when there is nothing to measure (fewer than two tokens or no elapsed time).
    """
    if tokens < 2 or len(times) < 2 or times[-1] <= times[0]:
        return None
    return (tokens - 1) / (times[-1] - times[0])


def throughput(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens per second over a whole request, first token included.

    Unlike the rate between first and last token, this cannot be flattered by a server that
    holds tokens back and sends them in bursts.
    """
    if not tokens or not seconds or seconds <= 0:
        return None
    return tokens / seconds


def speedup(ours: float | None, peer: float | None, *, higher_is_better: bool) -> float | None:
    """How many times better ours is than the peer's figure (>1: ours is better)."""
    if ours is None or peer is None or ours <= 0 or peer <= 0:
        return None
    return ours / peer if higher_is_better else peer / ours


def spread(values: Sequence[float | None]) -> dict[str, float]:
    """min, median and max of the figures present in `values` (an empty dict for none): what
    a workload repeated in rounds reports, so one bad round shows instead of averaging away."""
    present = [v for v in values if v is not None]
    if not present:
        return {}
    return {"min": min(present), "median": percentile(present, 50), "max": max(present)}


def decode_span_rate(streams: Sequence[tuple[int, Sequence[float]]]) -> float | None:
    """Decode tokens per second of streams that ran together: each stream's tokens after its
    first, over the span from the earliest first token to the latest last one.

    `streams` holds each stream's output tokens and its tokens' arrival times (seconds from
    the same start). One stream: its `decode_rate`. Prefill before the first token is left
    out; a stream's prefill while others decode is not (the machine spent it).
    """
    timed = [(tokens, times) for tokens, times in streams if tokens >= 2 and len(times) >= 2]
    if not timed:
        return None
    start = min(times[0] for _, times in timed)
    end = max(times[-1] for _, times in timed)
    if end <= start:
        return None
    return sum(tokens - 1 for tokens, _ in timed) / (end - start)
