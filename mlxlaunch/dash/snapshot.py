"""Figures of a stats snapshot, formatted for the dashboard's narrow cards.

The snapshot itself is the wire type `mlxlaunch.protocol.stats.StatsSnapshot`, parsed from the
server's JSON with `StatsSnapshot.model_validate_json`, as every reader of it does.
"""

from __future__ import annotations

from mlxlaunch.units import format_bytes


def human_bytes(n: int) -> str:
    """`1536` -> `1.5 KiB`; zero reads as `0 B` (the one formatter every command uses)."""
    return format_bytes(n)


def human_duration(seconds: float) -> str:
    """`75` -> `1m15s`; `3725` -> `1h02m`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
