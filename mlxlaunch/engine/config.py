"""Engine configuration: which model, how much work at once, and test seams."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from mlxlaunch.engine.settings import DEFAULT_CACHE_DISK, KV_BITS, KV_GROUP_SIZES, parse_size
from mlxlaunch.engine.types import GenerationRequest
from mlxlaunch.store.memory import ENGINE_MEMORY_SHARE

# A logits processor as mlx-lm calls it: (tokens so far, logits) -> logits.
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
LogitsHook = Callable[[GenerationRequest, Any], Sequence[LogitsProcessor] | None]
ModelWrapper = Callable[[nn.Module], nn.Module]
# How prompts are rendered: "stable" (each prompt extends the previous one; see
# engine/prompt/stable.py) or "exact" (the chat template's own output).
RenderMode = Literal["exact", "stable"]
RENDER_MODES: tuple[RenderMode, ...] = ("exact", "stable")
# Speculative decoding (engine/decoding/drafting.py).
SpeculateMode = Literal["auto", "lookup", "draft", "off"]
SPECULATE_MODES: tuple[SpeculateMode, ...] = ("auto", "lookup", "draft", "off")


@dataclass(frozen=True)
class ClusterRole:
    """This process's part in a cluster: its rank group and how the model is split."""

    group: Any  # runtime/rank_group.RankGroup (the face imports no sub-room)
    parallel: Literal["tensor", "pipeline"]

    @property
    def shard_name(self) -> str:
        """Names what this rank holds, e.g. `tensor-rank1of2`: its saved prefixes are its
        own (one file per rank under the same key), apart from one machine's."""
        return f"{self.parallel}-rank{self.group.rank}of{self.group.size}"


def _on_gpu() -> bool:
    return bool(mx.default_device().type == mx.DeviceType.gpu)


def default_max_concurrency() -> int:
    """Sequences decoded together: 8 on a GPU and on a CPU alike.

    Measured on CPU (`mlx bench`, 8 streams of ~2k prompt tokens and 48 out, 2 cores, test
    models, OpenBLAS and reference BLAS, 3 rounds each): the wall time of all 8 was the same
    with 4 or 8 (within ±10%, the run-to-run noise), while 8 gave the 8 streams their first
    token 20–55% sooner — with 4, half of them queue behind whole generations of the others.
    """
    return 8


GIB = 1024**3
DEFAULT_CACHE_DISK_BYTES = parse_size(DEFAULT_CACHE_DISK)  # the flag's default, as bytes


def default_cache_memory() -> int:
    """Prefix-cache memory budget: a quarter of RAM, at most 8 GiB (2 GiB when unknown)."""
    from mlxlaunch.store.memory import system_memory_bytes  # read-only machine facts

    total = system_memory_bytes()
    return min(8 * GIB, total // 4) if total > 0 else 2 * GIB


def default_prefill_chunk() -> int:
    """Prefill step size: on CPU, 256–512-token chunks beat 2,048 at long contexts (FACTS.md)."""
    return 2048 if _on_gpu() else 512


@dataclass
class EngineConfig:
    """How the engine loads and serves one model.

    Args:
        model: a local model directory or a hub id (names and aliases are resolved above).
        context_length: override of the model's context window, in tokens.
        max_concurrency: requests decoded in one batch; more wait in the queue.
        prefill_chunk: prompt tokens processed per step, interleaved with decode steps.
        max_queue: waiting requests beyond which `submit` raises Overloaded.
        max_queued_tokens: waiting prompt tokens beyond which `submit` raises Overloaded.
        logits_hook: test seam; returns extra logits processors for a request.
        model_wrapper: test seam; wraps the loaded model (e.g. to inject failures).
        clock: monotonic clock used for timings.
        idle_clear_s: seconds without requests after which the MLX buffer cache is cleared
            (None: never).
        keep_alive_s: seconds without requests after which the model is unloaded; it loads
            again on the next request (None: stay loaded; 0: unload as soon as idle).
        sweep_poll_s: how often an idle worker looks at the clock for the two above.
        memory_fraction: share of RAM MLX may use (memory limit; on macOS also the wired
            limit); None leaves MLX's limits alone.
        dedupe: serve a request identical to a running one from the same generation.
        cache_memory_bytes: prefix-cache memory budget (None: `default_cache_memory()`;
            0: no prefix cache).
        cache_dir: where reused prefixes are saved for later processes (None: memory only).
        cache_disk_bytes: budget of `cache_dir`, least recently used entries go first.
        cache_block_tokens: tokens per block of the prefix cache's trie.
        cache_restore: disk entries of this model restored into memory at load (warm start).
        tool_format: the model's tool-call format by name (`store.dialects.DIALECTS`), for a
            model whose template hides it; None: detected from the tokenizer and template.
        render: "stable" (default: each prompt extends the previous prompt and output, so the
            prefix cache prefills only what is new) or "exact" (the chat template's own
            output, which may re-render the past).
        cluster: this process's rank of a cluster serving the model sharded (None: one
            process, the whole model); see engine/cluster/.
        speculate: speculative decoding: "auto" (the draft model when one is given, else
            prompt lookup, where the model allows it), "lookup" or "draft" (that drafter, and
            loading fails where it cannot run), "off".
        draft_model: a local directory of a small model with the same tokenizer, whose
            greedy tokens are the drafts (`--draft-model`).
        kv_bits: hold the KV caches (running sequences, prefix cache, disk tier) quantized to
            8 or 4 bits a value (`--kv-bits`; None: the model's own precision).
        kv_group_size: values per quantization group (`--kv-group-size`; None: 64, or the
            largest of 32/64/128 that divides the model's head dimension).
        share_weights: load a directory another engine of this MLX thread holds as that
            engine's copy (several models, engine/models.py: the small model and the main
            one's draft model share their weights).
        debug_cache: keep the prompt text around each cache miss in stats and the log
            (`--debug-cache`); off, a miss says only where it happened, with digests of the
            text, since every client with the token can read stats (engine/cache/misses.py).
    """

    model: str
    context_length: int | None = None
    max_concurrency: int = field(default_factory=default_max_concurrency)
    prefill_chunk: int = field(default_factory=default_prefill_chunk)
    max_queue: int = 64
    max_queued_tokens: int = 1_000_000
    logits_hook: LogitsHook | None = None
    model_wrapper: ModelWrapper | None = None
    clock: Callable[[], float] = time.monotonic
    recent_requests: int = 50  # request records kept for stats()
    idle_clear_s: float | None = 30.0
    keep_alive_s: float | None = None
    sweep_poll_s: float = 1.0
    memory_fraction: float | None = ENGINE_MEMORY_SHARE
    dedupe: bool = True
    cache_memory_bytes: int | None = None
    cache_dir: Path | None = None
    cache_disk_bytes: int = DEFAULT_CACHE_DISK_BYTES
    cache_block_tokens: int = 256
    cache_restore: int = 4
    tool_format: str | None = None
    render: RenderMode = "stable"
    debug_cache: bool = False
    speculate: SpeculateMode = "auto"
    draft_model: str | None = None
    cluster: ClusterRole | None = None
    kv_bits: int | None = None
    kv_group_size: int | None = None
    share_weights: bool = False

    def __post_init__(self) -> None:
        if self.render not in RENDER_MODES:
            raise ValueError(f"render must be one of {', '.join(RENDER_MODES)}")
        if self.speculate not in SPECULATE_MODES:
            raise ValueError(f"speculate must be one of {', '.join(SPECULATE_MODES)}")
        if self.speculate == "draft" and self.draft_model is None:
            raise ValueError("speculate 'draft' needs a draft model")
        if self.cache_block_tokens < 1:
            raise ValueError("cache_block_tokens must be at least 1")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be at least 2")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise ValueError("memory_fraction must be in (0, 1]")
        if self.kv_bits is not None and self.kv_bits not in KV_BITS:
            raise ValueError(f"kv_bits must be one of {', '.join(map(str, KV_BITS))}")
        if self.kv_group_size is not None and self.kv_group_size not in KV_GROUP_SIZES:
            raise ValueError(f"kv_group_size must be one of {', '.join(map(str, KV_GROUP_SIZES))}")
        if self.sweep_poll_s <= 0:
            raise ValueError("sweep_poll_s must be positive")
