"""What this machine can compute with, for judging which models are usable, not only loadable.

Memory says whether a model loads; compute says whether it answers in useful time. On MLX's CPU
backend every token reads all active weights through a few cores, and Claude Code's first
prompt (~15-20k tokens) costs two multiply-adds per active parameter per token, so a model
that fits in memory can still take many minutes per turn. Read without importing mlx (the
store never loads weights).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from typing import Literal

Backend = Literal["metal", "cuda", "cpu"]
BACKENDS: tuple[Backend, ...] = ("metal", "cuda", "cpu")

# On the CPU backend, bytes of active weights per token a core can stream at a usable decode
# rate (a few tokens/s) while a 20k-token prefill still finishes in minutes, not hours. Two
# cores: 1 GiB of active weights, a 1.5B model at 4 bits.
CPU_ACTIVE_BYTES_PER_CORE = 512 * 1024**2

_ACTIVE = re.compile(r"^\s*([\d.]+)\s*B\s*-\s*A\s*([\d.]+)\s*B\s*$", re.I)


@dataclass(frozen=True)
class Compute:
    """The backend MLX will use here and the cores behind it."""

    backend: Backend
    cores: int

    @property
    def active_bytes_budget(self) -> int | None:
        """The most active weight bytes per token worth recommending (None: no limit)."""
        if self.backend != "cpu":
            return None
        return max(1, self.cores) * CPU_ACTIVE_BYTES_PER_CORE

    def describe(self) -> str:
        """E.g. "Metal GPU" or "CPU only (2 cores)"."""
        if self.backend == "metal":
            return "Metal GPU"
        if self.backend == "cuda":
            return "CUDA GPU"
        return f"CPU only ({self.cores} cores)"


def this_machine() -> Compute:
    """The compute MLX gets on this machine: Metal on Apple Silicon, CUDA where the
    `mlx-cuda` wheel is installed, else the CPU backend."""
    cores = os.cpu_count() or 1
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Compute("metal", cores)
    from importlib import metadata  # ~0.07 s: only when asked, not when the catalog loads

    for dist in ("mlx-cuda", "mlx_cuda"):
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        return Compute("cuda", cores)
    return Compute("cpu", cores)


def active_share(params: str) -> float:
    """The share of a model's weights each token uses: 1 for dense models, active/total for
    mixtures of experts named like "30B-A3B"."""
    match = _ACTIVE.match(params)
    if match is None:
        return 1.0
    total, active = float(match.group(1)), float(match.group(2))
    return min(1.0, active / total) if total > 0 else 1.0


__all__ = ["BACKENDS", "Backend", "Compute", "active_share", "this_machine"]
