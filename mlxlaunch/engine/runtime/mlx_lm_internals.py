"""mlx-lm's private names, each behind one small function: the only place the engine reads them.

The engine leans on a few mlx-lm internals that no API promises (and on one of transformers',
behind mlx-lm's tokenizer wrapper). They are listed in `PRIVATE_NAMES`, with what
depends on each; `tests/test_mlx_lm_internals.py` looks every one up on real mlx-lm objects, so
an upgrade that renames or removes one fails there, by name, with the installed version.

Everything outside `engine/runtime/` calls the functions here instead of touching the names, and
`tests/test_rooms.py` fails when a module elsewhere reads a private attribute that is not its own.
The functions degrade where they can: a reader that finds nothing returns what means "not
available" (the caller then takes the slower public path), never raises.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model

# The attention function mlx-lm's model modules import by name from `mlx_lm.models.base`.
ATTENTION = "scaled_dot_product_attention"


@dataclass(frozen=True)
class PrivateName:
    """One name the engine relies on: `owner` (a class whose instances have it, or a module) has
    attribute `name`; `use` says what breaks without it."""

    owner: str
    name: str
    use: str


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "mlx_lm.models.cache.BatchKVCache",
        "_idx",
        "batch_cache_holding (a lone reused prefix hands its buffers to a batch, cache/blocks.py)"
        " and RowKVCache.of_batch (a prefilled batch's rows decode from where they end)",
    ),
    PrivateName(
        "mlx_lm.models.cache.BatchKVCache",
        "left_padding",
        "left_padding: CPU attention treats an unpadded lone sequence's mask as causal",
    ),
    PrivateName(
        "mlx_lm.models.cache.BatchKVCache",
        "_right_padding",
        "right_padding: a right-padded batch keeps mlx-lm's attention",
    ),
    PrivateName(
        "mlx_lm.tokenizer_utils.TokenizerWrapper",
        "_tokenizer",
        "hf_tokenizer_of: grammars (llguidance) and incremental tokenization",
    ),
    PrivateName(
        "transformers.PreTrainedTokenizerFast",
        "_encode_plus",
        "tokenizers_backend_of: a subclass that rewrites text before encoding is not trusted",
    ),
    PrivateName(
        "mlx_lm.models.base",
        ATTENTION,
        "base_attention: CPU attention falls back to mlx-lm's own function",
    ),
    PrivateName(
        "mlx_lm.models.<model type>",
        ATTENTION,
        "bind_attention: CPU attention replaces the name each model module imported",
    ),
    PrivateName(
        "mlx_lm.models.<model type>.Model.__call__",
        "cache",
        "forward_cache: CPU attention tells a forward pass's last layer by its cache argument",
    ),
    PrivateName(
        "mlx_lm.utils.load_model",
        "get_model_classes",
        "model_classes: the cluster's shard plan builds the architecture as load_model does",
    ),
)


def model_classes(config: dict[str, Any]) -> tuple[Any, Any]:
    """(Model class, ModelArgs class) for `config`, by the lookup `load_model` itself uses (the
    default of its `get_model_classes` parameter), so mlx-lm's renames stay its own."""
    lookup = inspect.signature(load_model).parameters["get_model_classes"].default
    model_class, args_class = lookup(config=config)
    return model_class, args_class


def mlx_lm_version() -> str:
    """The installed mlx-lm version (for messages)."""
    import mlx_lm

    return str(getattr(mlx_lm, "__version__", "unknown"))


# --- KV caches --------------------------------------------------------------------------


def batch_cache_holding(keys: mx.array, values: mx.array, length: int) -> BatchKVCache:
    """A one-sequence `BatchKVCache` that owns `keys` and `values` (no copy): their first
    `length` positions are the sequence's, the rest is room it writes new tokens into."""
    batch = BatchKVCache([0])
    batch.keys, batch.values = keys, values  # type: ignore[assignment]  # typed None there
    batch.offset = batch.offset + length
    batch._idx = length  # where the batch writes its next tokens
    return batch


def left_padding(cache: Any) -> Any:
    """A batch cache's per-sequence left padding (an mx.array), or None."""
    return getattr(cache, "left_padding", None)


def right_padding(cache: Any) -> Any:
    """A batch cache's right padding while a prefill is padded on the right, else None."""
    return getattr(cache, "_right_padding", None)


# --- tokenizers -------------------------------------------------------------------------


def hf_tokenizer_of(wrapper: TokenizerWrapper) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's `TokenizerWrapper`."""
    return wrapper._tokenizer


def tokenizers_backend_of(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` whose `encode` gives exactly what `tokenizer.encode(text,
    add_special_tokens=False)` gives, or None where that cannot be established.

    `tokenizer`: mlx-lm's wrapper or a Hugging Face tokenizer. Transformers' fast tokenizers
    call the Rust backend directly; subclasses that rewrite the text first (mlx-lm's
    NewlineTokenizer, for one) override `encode`, so only an unmodified `encode`/`_encode_plus`
    of the transformers base class counts.
    """
    try:
        import tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - both ship with mlx-lm
        return None
    # mlx-lm's wrapper forwards `encode` to the Hugging Face tokenizer it wraps.
    if isinstance(tokenizer, TokenizerWrapper) and "encode" not in vars(TokenizerWrapper):
        tokenizer = hf_tokenizer_of(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers only
    if not isinstance(backend, tokenizers.Tokenizer):
        return None
    cls = type(tokenizer)
    for name in ("encode", "_encode_plus"):
        if getattr(cls, name, None) is not getattr(PreTrainedTokenizerFast, name, None):
            return None
    if getattr(tokenizer, "split_special_tokens", False) or backend.encode_special_tokens:
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    return backend


# --- model modules: attention and the forward pass --------------------------------------


def base_attention() -> Callable[..., mx.array] | None:
    """mlx-lm's own `scaled_dot_product_attention` (None if it is not where expected)."""
    from mlx_lm.models import base

    found = getattr(base, ATTENTION, None)
    return found if callable(found) else None


def model_modules() -> list[ModuleType]:
    """The mlx-lm model modules imported so far (`mlx_lm.models.*`, `base` left out)."""
    return [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("mlx_lm.models.") and name != "mlx_lm.models.base" and module is not None
    ]


def bound_attention(module: ModuleType) -> Any:
    """The attention function `module` calls (what it imported under mlx-lm's name)."""
    return getattr(module, ATTENTION, None)


def bind_attention(module: ModuleType, function: Callable[..., mx.array]) -> None:
    """Make `module` call `function` as its attention."""
    setattr(module, ATTENTION, function)


def forward_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The per-layer cache list passed to a model's `__call__(inputs, cache=None, …)`, given
    that call's arguments after `self`."""
    return kwargs.get("cache", args[1] if len(args) > 1 else None)
