"""How much memory a model needs and whether this machine has it.

Estimates, not measurements: weights as stored, plus room for the KV cache and activations of a
long Claude Code session, plus the runtime itself. Callers pass `total_memory` so tests (and
`mlx models recommend --memory`) can ask about other machines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mlxlaunch.units import format_bytes

GIB = 1024**3

# KV cache + activations for a ~64k-token session are roughly a fifth of the weights for the
# dense and MoE models in the catalog; the runtime (Python, MLX, tokenizer) needs ~1.5 GiB.
KV_AND_ACTIVATION_SHARE = 0.20
RUNTIME_OVERHEAD_BYTES = int(1.5 * GIB)

# macOS lets the GPU wire about three quarters of unified memory by default; use the same
# budget everywhere so an answer does not change with the platform.
USABLE_SHARE = 0.75


def system_memory_bytes() -> int:
    """Total physical memory of this machine, in bytes (0 when the OS will not say)."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    return int(pages) * int(page_size) if pages > 0 and page_size > 0 else 0


def memory_needed(weights_bytes: int) -> int:
    """Bytes of memory a model with `weights_bytes` of weights needs to serve a long session."""
    return int(weights_bytes * (1 + KV_AND_ACTIVATION_SHARE)) + RUNTIME_OVERHEAD_BYTES


def usable_memory(total_memory: int) -> int:
    """The share of `total_memory` a model may use."""
    return int(total_memory * USABLE_SHARE)


@dataclass(frozen=True)
class MemoryFit:
    """Whether a model fits: the numbers behind the answer, for messages."""

    needed: int
    usable: int
    total: int

    @property
    def fits(self) -> bool:
        """True when the estimate fits in the usable share (or the total is unknown)."""
        return self.total <= 0 or self.needed <= self.usable

    def describe(self) -> str:
        """One line, e.g. 'needs ~5.4 GiB of 12.0 GiB usable (16.0 GiB total): fits'."""
        if self.total <= 0:
            return f"needs ~{format_bytes(self.needed)} (this machine's memory is unknown)"
        verdict = "fits" if self.fits else "does NOT fit"
        return (
            f"needs ~{format_bytes(self.needed)} of {format_bytes(self.usable)} usable "
            f"({format_bytes(self.total)} total): {verdict}"
        )


def memory_fit(weights_bytes: int, total_memory: int | None = None) -> MemoryFit:
    """Judge whether weights of `weights_bytes` fit a machine with `total_memory` bytes."""
    total = system_memory_bytes() if total_memory is None else total_memory
    return MemoryFit(needed=memory_needed(weights_bytes), usable=usable_memory(total), total=total)


__all__ = [
    "GIB",
    "MemoryFit",
    "format_bytes",
    "memory_fit",
    "memory_needed",
    "system_memory_bytes",
    "usable_memory",
]
