"""Model loading through mlx-lm and the facts the rest of the engine needs about the model.

The context window comes from the one rule in `engine/settings.py` (the store's reading of
config.json, the `--context-length` override, a fallback).

Runs on the engine worker thread (it creates MLX arrays). Names are resolved before this point:
`model` is a local directory or a hub id, never an alias.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import mlx.nn as nn
from mlx_lm import load as mlx_lm_load
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.settings import context_window_of
from mlxlaunch.engine.types import ModelInfo
from mlxlaunch.errors import ModelLoadError, ModelNotFound


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer and facts."""

    model: nn.Module  # what runs the forward pass (possibly wrapped by a test seam)
    base_model: nn.Module  # the mlx-lm model itself; KV caches are shaped from it
    tokenizer: TokenizerWrapper
    info: ModelInfo


def _local_path(model: str) -> Path:
    path = Path(model).expanduser()
    if path.exists():
        return path
    # A hub id: mlx-lm fetched (or found) it in the hub cache; ask the cache where it is.
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


def _tool_format(tokenizer: TokenizerWrapper) -> str | None:
    parser = tokenizer.tool_parser
    if parser is None:
        return None
    module = importlib.import_module(parser.__module__)
    return str(module.__name__.rsplit(".", 1)[-1])


def _eos_ids(tokenizer: TokenizerWrapper) -> tuple[int, ...]:
    return tuple(sorted(int(i) for i in tokenizer.eos_token_ids))


def load_model(config: EngineConfig) -> LoadedModel:
    """Load `config.model` with mlx-lm (never running code shipped with the model)."""
    path = Path(config.model).expanduser()
    looks_local = path.is_absolute() or config.model.startswith((".", "~")) or path.exists()
    if looks_local and not path.exists():
        raise ModelNotFound(f"model directory not found: {config.model}")
    try:
        loaded = mlx_lm_load(
            str(path) if path.exists() else config.model,
            return_config=True,
            trust_remote_code=False,
        )
        model, tokenizer, model_config = loaded[0], loaded[1], loaded[2]  # type: ignore[misc]
    except Exception as exc:  # mlx-lm raises many kinds; all mean "cannot load"
        raise ModelLoadError(f"cannot load model {config.model}: {exc}") from exc
    base_model = model
    if config.model_wrapper is not None:
        model = config.model_wrapper(model)
    info = ModelInfo(
        id=config.model,
        path=str(_local_path(config.model)),
        context_window=context_window_of(model_config, config.context_length),
        has_thinking=bool(tokenizer.has_thinking),
        think_start=tokenizer.think_start,
        think_end=tokenizer.think_end,
        tool_call_start=tokenizer.tool_call_start,
        tool_call_end=tokenizer.tool_call_end,
        tool_format=_tool_format(tokenizer),
        vision=False,
        eos_token_ids=_eos_ids(tokenizer),
    )
    return LoadedModel(model=model, base_model=base_model, tokenizer=tokenizer, info=info)
