"""How much memory a model needs and whether this machine has it.

Estimates, not measurements: weights as stored, plus room for the KV cache and activations of a
long Claude Code session, plus the runtime itself. Callers pass `total_memory` so tests (and
`mlx models recommend --memory`) can ask about other machines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mlxlaunch.units import format_bytes

GIB = 1024**3

# KV cache + activations for a ~64k-token session are roughly a fifth of the weights for the
# dense and MoE models in the catalog; the runtime (Python, MLX, tokenizer) needs ~1.5 GiB.
KV_AND_ACTIVATION_SHARE = 0.20
RUNTIME_OVERHEAD_BYTES = int(1.5 * GIB)

# macOS lets the GPU wire about three quarters of unified memory by default; use the same
# budget everywhere so an answer does not change with the platform.
USABLE_SHARE = 0.75


# The share of RAM the engine lets MLX use by default (`--memory-fraction`, engine/config.py).
ENGINE_MEMORY_SHARE = 0.85
# Bytes of an unquantized cached value (bfloat16 or float16: every catalog model's dtype).
KV_DTYPE_BYTES = 2
# Values per quantization group of a quantized KV cache, unless told (`--kv-group-size`).
DEFAULT_KV_GROUP_SIZE = 64


def kv_value_bytes(bits: int | None, group_size: int, dtype_bytes: int = KV_DTYPE_BYTES) -> float:
    """Bytes one cached key or value element costs held at `bits` (None: unquantized): its
    packed bits and its share of its group's scale and bias (in the activations' dtype)."""
    if bits is None:
        return float(dtype_bytes)
    return bits / 8 + 2 * dtype_bytes / group_size


@dataclass(frozen=True)
class KVShape:
    """What one token's KV holds: full-attention layers, KV heads and their width."""

    layers: int
    kv_heads: int
    head_dim: int

    def bytes_per_token(
        self, bits: int | None = None, group_size: int = DEFAULT_KV_GROUP_SIZE
    ) -> int:
        """KV bytes one token of context costs, held at `bits` (None: unquantized)."""
        values = 2 * self.layers * self.kv_heads * self.head_dim  # keys and values
        return int(values * kv_value_bytes(bits, group_size))


def kv_shape_of(config: dict[str, Any]) -> KVShape | None:
    """A model's KV shape from its config.json (None when it does not say); every layer is
    taken for full attention, so a sliding-window model is over-counted (a shorter window)."""
    for source in (config.get("text_config") or {}, config):
        layers = source.get("num_hidden_layers")
        heads = source.get("num_attention_heads")
        kv_heads = source.get("num_key_value_heads") or heads
        head_dim = source.get("head_dim")
        hidden = source.get("hidden_size")
        if head_dim is None and isinstance(heads, int) and heads and isinstance(hidden, int):
            head_dim = hidden // heads
        if (
            isinstance(layers, int)
            and isinstance(kv_heads, int)
            and isinstance(head_dim, int)
            and min(layers, kv_heads, head_dim) > 0
        ):
            return KVShape(layers, kv_heads, head_dim)
    return None


def window_that_fits(
    window: int,
    weights_bytes: int,
    per_token: int,
    total_memory: int | None = None,
    share: float = ENGINE_MEMORY_SHARE,
) -> int:
    """The longest context up to `window` whose KV a machine holds beside the weights: the
    engine's memory limit (`share` of RAM) less the weights and the runtime. An estimate
    before loading; the engine caps what it serves by what it measures after."""
    total = system_memory_bytes() if total_memory is None else total_memory
    if total <= 0 or per_token <= 0:
        return window
    free = int(total * share) - weights_bytes - RUNTIME_OVERHEAD_BYTES
    return max(0, min(window, free // per_token))


# The KV precisions a window is reported at: unquantized, `--kv-bits 8`, `--kv-bits 4`.
KV_PRECISIONS: tuple[int | None, ...] = (None, 8, 4)


def windows_here(
    window: int, weights_bytes: int, kv: KVShape | None, total_memory: int | None = None
) -> dict[int, int]:
    """The longest context a machine holds, by bits a KV value is held in (16: unquantized);
    {} when the model's KV shape is unknown."""
    if kv is None:
        return {}
    return {
        bits or 16: window_that_fits(window, weights_bytes, kv.bytes_per_token(bits), total_memory)
        for bits in KV_PRECISIONS
    }


def describe_windows(windows: dict[int, int], window: int) -> str:
    """E.g. 'holds 31,000 of its 262,144-token window (8-bit KV: 55,000; 4-bit: 96,000)'."""
    if not windows:
        return f"{window:,}-token window"
    full = windows[16]
    head = (
        f"holds all of its {window:,}-token window"
        if full >= window
        else f"holds {full:,} of its {window:,}-token window"
    )
    others = [f"{bits}-bit KV: {n:,}" for bits, n in windows.items() if bits != 16]
    return f"{head} ({'; '.join(others)})" if full < window else head


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
    "KVShape",
    "MemoryFit",
    "describe_windows",
    "format_bytes",
    "kv_shape_of",
    "kv_value_bytes",
    "memory_fit",
    "memory_needed",
    "system_memory_bytes",
    "usable_memory",
    "window_that_fits",
    "windows_here",
]
