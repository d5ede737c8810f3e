"""Figures of a stats snapshot, formatted for the dashboard's narrow cards.

The snapshot itself is the wire type `mlxlaunch.protocol.stats.StatsSnapshot`, parsed from the
server's JSON with `StatsSnapshot.model_validate_json`, as every reader of it does.
"""

from __future__ import annotations


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
