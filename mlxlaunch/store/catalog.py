"""Short aliases for well-known MLX models that handle Claude Code's tool use well.

Sizes are the download size of the MLX weights on the hub (rounded); context windows are the
`max_position_embeddings` of each model's config. `rank` orders quality for Claude Code work
(higher is better): `recommend` picks the best-ranked entry that fits the machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mlxlaunch.store.compute import Compute, active_share, this_machine
from mlxlaunch.store.memory import (
    GIB,
    KVShape,
    MemoryFit,
    format_bytes,
    memory_fit,
    memory_needed,
    windows_here,
)

GB = 1000**3


@dataclass(frozen=True)
class CatalogEntry:
    """One curated model: its alias, hub repo, and the figures used to pick it."""

    alias: str
    repo_id: str
    kind: str  # "coder", "general" or "vision" (reads images too)
    params: str  # as the model's authors name it, e.g. "30B-A3B"
    bits: int
    size_bytes: int
    context_window: int
    rank: int
    note: str = ""
    kv: KVShape | None = None  # what a token's KV holds (from the model's config.json)

    def windows_here(self, total_memory: int | None = None) -> dict[int, int]:
        """The longest context of this model a machine holds, by KV bits (store.memory)."""
        return windows_here(self.context_window, self.size_bytes, self.kv, total_memory)

    @property
    def family(self) -> str:
        """The model family its repo names (`Qwen3-Coder-30B-…` → `qwen3`): models of one
        family share a tokenizer, so a small one can also draft for a big one."""
        return self.repo_id.rsplit("/", 1)[-1].split("-", 1)[0].lower()

    @property
    def memory_bytes(self) -> int:
        """Memory this model needs for a long session (see `store.memory`)."""
        return memory_needed(self.size_bytes)

    @property
    def active_bytes(self) -> int:
        """Weight bytes each generated token reads (a mixture of experts reads its active
        experts only)."""
        return int(self.size_bytes * active_share(self.params))

    def suits(self, compute: Compute | None) -> bool:
        """True when `compute` runs this model at a usable speed (None: not judged)."""
        budget = compute.active_bytes_budget if compute is not None else None
        return budget is None or self.active_bytes <= budget


def _gb(x: float) -> int:
    return int(x * GB)


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry("qwen3-coder-30b", "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit", "coder",
                 "30B-A3B", 4, _gb(17.2), 262_144, 90, "MoE coder; fast for its size",
                 kv=KVShape(48, 4, 128)),
    CatalogEntry("qwen3-coder-30b-8bit", "mlx-community/Qwen3-Coder-30B-A3B-Instruct-8bit",
                 "coder", "30B-A3B", 8, _gb(32.5), 262_144, 92, kv=KVShape(48, 4, 128)),
    CatalogEntry("qwen-coder-32b", "mlx-community/Qwen2.5-Coder-32B-Instruct-4bit", "coder",
                 "32B", 4, _gb(18.4), 32_768, 70, kv=KVShape(64, 8, 128)),
    CatalogEntry("qwen-coder-14b", "mlx-community/Qwen2.5-Coder-14B-Instruct-4bit", "coder",
                 "14B", 4, _gb(8.3), 32_768, 55, kv=KVShape(48, 8, 128)),
    CatalogEntry("qwen-coder-7b", "mlx-community/Qwen2.5-Coder-7B-Instruct-4bit", "coder",
                 "7B", 4, _gb(4.3), 32_768, 40, kv=KVShape(28, 4, 128)),
    CatalogEntry("qwen-coder-1.5b", "mlx-community/Qwen2.5-Coder-1.5B-Instruct-4bit", "coder",
                 "1.5B", 4, _gb(0.87), 32_768, 10, "for trying things out", kv=KVShape(28, 2, 128)),
    CatalogEntry("qwen3-30b", "mlx-community/Qwen3-30B-A3B-4bit", "general",
                 "30B-A3B", 4, _gb(17.2), 40_960, 80, "thinking + tools", kv=KVShape(48, 4, 128)),
    CatalogEntry("qwen3-14b", "mlx-community/Qwen3-14B-4bit", "general",
                 "14B", 4, _gb(8.3), 40_960, 60, "thinking + tools", kv=KVShape(40, 8, 128)),
    CatalogEntry("qwen3-8b", "mlx-community/Qwen3-8B-4bit", "general",
                 "8B", 4, _gb(4.6), 40_960, 45, "thinking + tools", kv=KVShape(36, 8, 128)),
    CatalogEntry("qwen3-4b", "mlx-community/Qwen3-4B-4bit", "general",
                 "4B", 4, _gb(2.3), 40_960, 25, "thinking + tools", kv=KVShape(36, 8, 128)),
    # Vision models (mlx-vlm, the `vision` extra): recommended only when asked for by kind.
    CatalogEntry("qwen2.5-vl-7b", "mlx-community/Qwen2.5-VL-7B-Instruct-4bit", "vision",
                 "7B", 4, _gb(5.6), 128_000, 35, "sees images", kv=KVShape(28, 4, 128)),
    CatalogEntry("qwen2.5-vl-3b", "mlx-community/Qwen2.5-VL-3B-Instruct-4bit", "vision",
                 "3B", 4, _gb(3.1), 128_000, 15, "sees images", kv=KVShape(36, 2, 128)),
)  # fmt: skip

VISION = "vision"


def catalog_entry(alias: str) -> CatalogEntry | None:
    """The entry for `alias` (case-insensitive), or None."""
    wanted = alias.strip().lower()
    return next((e for e in CATALOG if e.alias == wanted), None)


def alias_for_repo(repo_id: str) -> str | None:
    """The alias that maps to `repo_id` (case-insensitive), if any."""
    wanted = repo_id.lower()
    return next((e.alias for e in CATALOG if e.repo_id.lower() == wanted), None)


@dataclass(frozen=True)
class Recommendation:
    """The catalog model for a machine, and why: what fits its memory, what its compute runs.

    The one rule behind `mlx models recommend`, `mlx doctor`, the demo's hint and the pull a
    launch offers; `speed_rule()` is its one explanation, quoted by each of them.
    """

    entry: CatalogEntry
    fit: MemoryFit
    compute: Compute | None  # None: judged by memory alone
    too_slow: tuple[CatalogEntry, ...] = ()  # better-ranked, fit in memory, too slow here

    def speed_rule(self) -> str | None:
        """Why bigger models that fit in memory were passed over, or None when none were.

        E.g. "CPU only (2 cores): a model is usable when each token reads at most 1.0 GiB of
        weights; qwen3-14b and 5 more fit in memory but would take minutes per reply".
        """
        budget = self.compute.active_bytes_budget if self.compute is not None else None
        if not self.too_slow or self.compute is None or budget is None:
            return None
        best = self.too_slow[0].alias
        more = f" and {len(self.too_slow) - 1} more" if len(self.too_slow) > 1 else ""
        return (
            f"{self.compute.describe()}: a model is usable when each token reads at most "
            f"{format_bytes(budget)} of weights; {best}{more} fit in memory but would take "
            "minutes per reply"
        )


def recommendation(
    total_memory: int | None = None,
    *,
    kind: str | None = None,
    entries: Iterable[CatalogEntry] = CATALOG,
    compute: Compute | None = None,
) -> Recommendation | None:
    """The best-ranked entry that fits a machine's memory and suits its compute, with the
    reasons (None if none fits in memory).

    Args:
        total_memory: bytes of RAM; None reads this machine's.
        kind: restrict to "coder", "general" or "vision" models (None: coder or general;
            a vision model is picked only when asked for).
        entries: the catalog to choose from (tests pass their own).
        compute: the machine's backend and cores. None: this machine's when `total_memory`
            is None too, else memory alone. On a CPU-only machine the models that fit but
            would be too slow are passed over (for the fastest one that fits, when none
            suits).
    """
    if compute is None and total_memory is None:
        compute = this_machine()
    fitting = [
        e
        for e in entries
        if (e.kind == kind if kind is not None else e.kind != VISION)
        and memory_fit(e.size_bytes, total_memory).fits
    ]
    if not fitting:
        return None
    suited = [e for e in fitting if e.suits(compute)]
    if suited:
        # Prefer rank, then a longer context (Claude Code's prompt alone is ~20k tokens).
        pick = max(suited, key=lambda e: (e.rank, e.context_window))
    else:
        pick = min(fitting, key=lambda e: (e.active_bytes, -e.rank))
    too_slow = sorted(
        (e for e in fitting if not e.suits(compute) and e.rank > pick.rank),
        key=lambda e: -e.rank,
    )
    fit = memory_fit(pick.size_bytes, total_memory)
    return Recommendation(pick, fit, compute, tuple(too_slow))


# The haiku tier's work (session titles, summaries, WebFetch digests, the safety verdict) is
# short and must come quickly: a small model is at most this big, and smaller than the main one.
SMALL_MODEL_MAX_BYTES = _gb(2.5)


def small_recommendation(
    beside: CatalogEntry,
    total_memory: int | None = None,
    *,
    entries: Iterable[CatalogEntry] = CATALOG,
    compute: Compute | None = None,
) -> Recommendation | None:
    """The small model to serve beside `beside` for Claude Code's haiku tier (`mlx serve|launch
    --small-model`), or None when none fits beside it.

    Both must fit together (one process: the weights of both, the runtime once). Of those
    that do: one of the main model's family first (the same tokenizer: it can draft for the
    main model too, `--speculate draft`), then one this machine runs at a usable speed, then
    the best-ranked.
    """
    if compute is None and total_memory is None:
        compute = this_machine()
    candidates = [
        e
        for e in entries
        if e is not beside
        and e.kind != VISION  # the haiku tier reads and writes text
        and e.size_bytes <= SMALL_MODEL_MAX_BYTES
        and e.size_bytes < beside.size_bytes
        and memory_fit(beside.size_bytes + e.size_bytes, total_memory).fits
    ]
    if not candidates:
        return None
    pick = max(candidates, key=lambda e: (e.family == beside.family, e.suits(compute), e.rank))
    return Recommendation(
        pick, memory_fit(beside.size_bytes + pick.size_bytes, total_memory), compute
    )


def vision_pick(total_memory: int | None = None) -> CatalogEntry:
    """The vision model to suggest for this machine (the smallest when none fits), named
    where a text-only model refuses an image."""
    found = recommend(total_memory, kind=VISION)
    return found or min((e for e in CATALOG if e.kind == VISION), key=lambda e: e.size_bytes)


def recommend(
    total_memory: int | None = None,
    *,
    kind: str | None = None,
    entries: Iterable[CatalogEntry] = CATALOG,
    compute: Compute | None = None,
) -> CatalogEntry | None:
    """The entry `recommendation()` picks (see there), without its reasons."""
    found = recommendation(total_memory, kind=kind, entries=entries, compute=compute)
    return found.entry if found is not None else None


__all__ = [
    "CATALOG",
    "GIB",
    "CatalogEntry",
    "Recommendation",
    "alias_for_repo",
    "catalog_entry",
    "recommend",
    "recommendation",
    "small_recommendation",
    "vision_pick",
]
