"""One row of the bench report: a workload's metric, a figure per server, their ratio.

Its own module so the workloads that build their rows next to their figures (the haiku tier)
and the report that lays them out share the type without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mlxlaunch.bench.stats import percentile, speedup, spread

# A round where ours did worse than this times the peer is marked in the report: well outside
# the noise of this machine's rounds (0.7–1.3×), where a stall shows.
SLOW_ROUND_RATIO = 0.8


@dataclass
class SummaryRow:
    """One metric of one workload: a figure per server and the in-process limit, if any."""

    workload: str
    metric: str
    unit: str  # "s", "ms", "tok/s" or "%" (a share, 0–1)
    higher_is_better: bool
    values: dict[str, float | None]
    limit: float | None = None
    notes: dict[str, str] = field(default_factory=dict)
    # False where a ratio would mislead: inter-token gaps of a server that sends tokens in
    # bursts are ~0, which says nothing about its speed.
    compare: bool = True
    # A workload run in rounds: each server's figure per round. `values` then holds their
    # medians, and the ratio is the median of the per-round ratios.
    rounds: dict[str, list[float | None]] = field(default_factory=dict)

    def speedup(self, ours: str, peer: str) -> float | None:
        """How many times better `ours` is than `peer` on this row (>1: ours is better)."""
        if not self.compare:
            return None
        if self.rounds:
            return spread(self.round_speedups(ours, peer)).get("median")
        return speedup(
            self.values.get(ours), self.values.get(peer), higher_is_better=self.higher_is_better
        )

    def round_speedups(self, ours: str, peer: str) -> list[float | None]:
        """The ratio of each round (empty for a row without rounds)."""
        pairs = zip(self.rounds.get(ours, []), self.rounds.get(peer, []), strict=False)
        return [speedup(a, b, higher_is_better=self.higher_is_better) for a, b in pairs]

    def slow_rounds(self, ours: str, peer: str) -> list[tuple[int, float]]:
        """(round number, ratio) of each round below SLOW_ROUND_RATIO."""
        ratios = enumerate(self.round_speedups(ours, peer), start=1)
        return [(n, r) for n, r in ratios if r is not None and r < SLOW_ROUND_RATIO]

    def as_dict(self, ours: str, peer: str) -> dict[str, Any]:
        """For the JSON report (the fields of a row with rounds come on top of the others)."""
        data = {
            "workload": self.workload,
            "metric": self.metric,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "values": self.values,
            "limit": self.limit,
            "speedup": self.speedup(ours, peer),
            "notes": self.notes,
        }
        if self.rounds:
            ratios = self.round_speedups(ours, peer)
            data |= {
                "rounds": self.rounds,
                "spread": {name: spread(figures) for name, figures in self.rounds.items()},
                "round_speedups": ratios,
                "round_speedup_spread": spread(ratios),
                "slow_rounds": [n for n, _ in self.slow_rounds(ours, peer)],
            }
        return data


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the figures present (None: none is)."""
    return percentile_of(values, 50)


def percentile_of(values: Iterable[float | None], p: float) -> float | None:
    present = [v for v in values if v is not None]
    return percentile(present, p) if present else None
