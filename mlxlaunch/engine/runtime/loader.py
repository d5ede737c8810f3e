"""Model loading through mlx-lm (or mlx-vlm, for a vision model) and the facts the rest of
the engine needs about the model.

The context window comes from the one rule in `engine/settings.py` (the store's reading of
config.json, the `--context-length` override, a fallback).

Runs on the engine worker thread (it creates MLX arrays). Names are resolved before this point:
`model` is a local directory or a hub id, never an alias.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx_lm import load as mlx_lm_load
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.runtime.learned_syntax import learn_json_call_syntax, learn_think_markers
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, head_dim, resolve
from mlxlaunch.engine.runtime.vision import VisionLanguageModel, is_vision_config, load_vision
from mlxlaunch.engine.settings import context_window_of
from mlxlaunch.engine.types import ModelInfo
from mlxlaunch.errors import ModelLoadError, ModelNotFound
from mlxlaunch.store.dialects import LEARNED_JSON, Dialect, detect_dialect, dialect_named
from mlxlaunch.store.generation_config import read_sampling_defaults

ToolParser = Callable[[str, Any], Any]

# Several models on one MLX thread (engine/models.py) load a directory once: the small model
# served beside the main one and the main one's draft model (the same small model, drafting)
# share one copy of the weights. Kept per thread, and only for engines that ask
# (`EngineConfig.share_weights`): engines on other threads never share arrays.
_loaded_here = threading.local()


def _load_shared(source: str, share: bool) -> tuple[nn.Module, Any, dict[str, Any]]:
    """mlx-lm's load of `source` (model, tokenizer, config); with `share`, the copy another
    engine of this thread holds, while it holds it."""
    if not share:
        loaded = mlx_lm_load(source, return_config=True, trust_remote_code=False)
        return loaded[0], loaded[1], loaded[2]  # type: ignore[misc]
    # Held while the model lives: the entry (and its tokenizer) goes with the last user.
    held: dict[str, tuple[Any, Any, dict[str, Any]]] = _loaded_here.__dict__.setdefault("held", {})
    key = os.path.realpath(source) if os.path.exists(source) else source
    if key in held and (model := held[key][0]()) is not None:
        return model, held[key][1], held[key][2]
    model, tokenizer, config = _load_shared(source, share=False)

    def forget(ref: Any, key: str = key) -> None:
        if key in held and held[key][0] is ref:
            del held[key]

    held[key] = (weakref.ref(model, forget), tokenizer, config)
    return model, tokenizer, config


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer and facts."""

    model: nn.Module  # what runs the forward pass (possibly wrapped by a test seam)
    base_model: nn.Module  # the mlx-lm model itself; KV caches are shaped from it
    tokenizer: TokenizerWrapper
    info: ModelInfo
    # mlx-lm's parser for the dialect, where the engine has no reader of its own for it.
    tool_parser: ToolParser | None = None
    kv: KVQuantization | None = None  # how its KV caches are held (None: unquantized)
    # A vision model (mlx-vlm's, runtime/vision.py): it prepares images and widens their
    # tokens; `base_model` is this too.
    vision: VisionLanguageModel | None = None


def _local_path(model: str) -> Path:
    path = Path(model).expanduser()
    if path.exists():
        return path
    # A hub id: mlx-lm fetched (or found) it in the hub cache; ask the cache where it is.
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


def _mlx_lm_format(tokenizer: TokenizerWrapper) -> str | None:
    """The name of the tool parser mlx-lm inferred for this tokenizer, if any."""
    parser = tokenizer.tool_parser
    if parser is None:
        return None
    module = importlib.import_module(parser.__module__)
    return str(module.__name__.rsplit(".", 1)[-1])


def _template_render(
    tokenizer: TokenizerWrapper,
) -> Callable[[list[dict[str, Any]], Any, bool], str]:
    def render(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation, tokenize=False
        )
        return str(text)

    return render


def _learned_dialect(tokenizer: TokenizerWrapper, known: Dialect | None) -> Dialect | None:
    """A JSON call syntax learned from the template, for markup no table knows (keeping any
    think markers the table found); None when the template shows none."""
    render = _template_render(tokenizer)
    if "tool_calls" not in str(tokenizer.chat_template or ""):
        return None
    learned = learn_json_call_syntax(render)
    if learned is None:
        return None
    return dataclasses.replace(
        LEARNED_JSON,
        tool_call_start=learned.start or None,
        tool_call_end=learned.end,
        leading_call=None if learned.start else learned.leading,
        think_start=known.think_start if known is not None else None,
        think_end=known.think_end if known is not None else None,
    )


@dataclass(frozen=True)
class ToolSyntax:
    """How the loaded model's tool calls are found and read."""

    dialect: Dialect | None
    tool_call_start: str | None
    tool_call_end: str | None
    parser: ToolParser | None


def tool_syntax(tokenizer: TokenizerWrapper, tool_format: str | None) -> ToolSyntax:
    """The model's dialect (named by `tool_format`, else detected from its template and
    vocabulary) with the markers and mlx-lm parser that go with it.

    For a dialect mlx-lm also reads, its parser module supplies the markers (mlx-lm knows them
    best) and the whole-span parser; for our own dialects mlx-lm's guess, if any, is ignored."""
    dialect = (
        dialect_named(tool_format)
        if tool_format
        else detect_dialect(tokenizer.chat_template, tokenizer.get_vocab())
    )
    if dialect is None or dialect.name == "none":
        learned = None if tool_format else _learned_dialect(tokenizer, dialect)
        if learned is not None:
            return ToolSyntax(learned, learned.tool_call_start, learned.tool_call_end, None)
        return ToolSyntax(dialect, None, None, None)
    if not dialect.mlx_lm_parser:
        return ToolSyntax(dialect, dialect.tool_call_start, dialect.tool_call_end, None)
    if _mlx_lm_format(tokenizer) == dialect.name:
        return ToolSyntax(
            dialect, tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser
        )
    try:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{dialect.name}")
    except ImportError:
        return ToolSyntax(dialect, dialect.tool_call_start, dialect.tool_call_end, None)
    return ToolSyntax(
        dialect,
        getattr(module, "tool_call_start", dialect.tool_call_start),
        getattr(module, "tool_call_end", dialect.tool_call_end),
        getattr(module, "parse_tool_call", None),
    )


def _eos_ids(tokenizer: TokenizerWrapper) -> tuple[int, ...]:
    return tuple(sorted(int(i) for i in tokenizer.eos_token_ids))


def _vision(path: Path) -> tuple[VisionLanguageModel, Any, dict[str, Any]] | None:
    """The vision model at `path` through mlx-vlm, with mlx-lm's tokenizer of it; None when
    `path` holds no vision model this engine serves, or mlx-vlm is not installed (then mlx-lm
    loads its language part, text-only)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    if not is_vision_config(json.loads(config_file.read_text())):
        return None
    try:
        import mlx_vlm  # noqa: F401  (the `vision` extra)
    except ImportError:
        return None
    from mlx_lm.utils import load_tokenizer

    model, config = load_vision(path)
    return model, load_tokenizer(path), config


def _sharded(config: EngineConfig, path: Path) -> tuple[Any, Any, Any]:
    """This rank's shard of the model, through mlx-lm's `sharded_load` (a collective: every
    rank loads at the same time, and it returns once all have)."""
    from mlx_lm.utils import sharded_load

    cluster = config.cluster
    assert cluster is not None
    group = cluster.group.group
    model, tokenizer, model_config = sharded_load(
        str(path) if path.exists() else config.model,
        pipeline_group=group if cluster.parallel == "pipeline" else None,
        tensor_group=group if cluster.parallel == "tensor" else None,
        return_config=True,
        trust_remote_code=False,
    )
    return model, tokenizer, model_config


def load_model(config: EngineConfig) -> LoadedModel:
    """Load `config.model` with mlx-lm (never running code shipped with the model)."""
    path = Path(config.model).expanduser()
    looks_local = path.is_absolute() or config.model.startswith((".", "~")) or path.exists()
    if looks_local and not path.exists():
        raise ModelNotFound(f"model directory not found: {config.model}")
    try:
        if config.cluster is not None:
            model, tokenizer, model_config = _sharded(config, path)
        else:
            source = str(path) if path.exists() else config.model
            vision = _vision(_local_path(config.model)) if path.exists() else None
            if vision is not None:
                model, tokenizer, model_config = vision
            else:
                model, tokenizer, model_config = _load_shared(source, config.share_weights)
    except Exception as exc:  # mlx-lm raises many kinds; all mean "cannot load"
        raise ModelLoadError(f"cannot load model {config.model}: {exc}") from exc
    base_model = model
    try:
        kv = resolve(config.kv_bits, config.kv_group_size, head_dim(base_model))
    except ValueError as exc:
        raise ModelLoadError(
            f"cannot quantize the KV cache of {config.model}: {exc}",
            hint="pick a --kv-group-size that divides it (32, 64 or 128)",
        ) from exc
    if config.model_wrapper is not None:
        model = config.model_wrapper(model)
    syntax = tool_syntax(tokenizer, config.tool_format)
    dialect = syntax.dialect
    think_start, think_end = tokenizer.think_start, tokenizer.think_end
    if think_start is None and dialect is not None and dialect.think_start:
        think_start, think_end = dialect.think_start, dialect.think_end
    if think_start is None and not (dialect is not None and dialect.channels):
        learned = learn_think_markers(_template_render(tokenizer))
        if learned is not None:  # markers no table knows: the renderer reads them too
            think_start, think_end = learned
            dialect = dataclasses.replace(
                dialect or Dialect("none"), think_start=think_start, think_end=think_end
            )
    info = ModelInfo(
        id=config.model,
        path=str(_local_path(config.model)),
        context_window=context_window_of(model_config, config.context_length),
        # Harmony reasons in its analysis channel, without think markers.
        has_thinking=think_start is not None or bool(dialect and dialect.channels),
        think_start=think_start,
        think_end=think_end,
        tool_call_start=syntax.tool_call_start,
        tool_call_end=syntax.tool_call_end,
        tool_format=dialect.name if dialect is not None and dialect.name != "none" else None,
        dialect=dialect,
        vision=isinstance(base_model, VisionLanguageModel),
        eos_token_ids=_eos_ids(tokenizer),
        sampling_defaults=read_sampling_defaults(_local_path(config.model), report=True),
    )
    return LoadedModel(
        model=model,
        base_model=base_model,
        tokenizer=tokenizer,
        info=info,
        tool_parser=syntax.parser,
        kv=kv,
        vision=base_model if isinstance(base_model, VisionLanguageModel) else None,
    )


@dataclass
class DraftLoaded:
    """A draft model for speculative decoding: it shares the main model's vocabulary."""

    model: nn.Module
    vocab_size: int  # the tokenizer's (the model's output may be padded past it)


def load_draft_model(path: str, main: LoadedModel, *, share: bool = False) -> DraftLoaded:
    """Load the draft model at `path` and check that it can draft for `main` (`share`: the
    weights of a model this thread serves from `path` too, see `_load_shared`).

    Raises:
        ModelLoadError: it cannot be loaded, or its tokenizer is not the main model's (the
            drafted token ids would mean other text), in words that say which differs.
    """
    try:
        model, tokenizer, _ = _load_shared(path, share)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the draft model {path}: {exc}") from exc
    vocab = tokenizer.get_vocab()
    mine = main.tokenizer.get_vocab()
    if vocab != mine:
        differ = sum(1 for text, i in mine.items() if vocab.get(text) != i)
        raise ModelLoadError(
            f"the draft model {path} has another vocabulary than {main.info.id} "
            f"({len(vocab)} against {len(mine)} tokens, {differ} of the main model's differ): "
            "its drafts would be other text",
            hint="pick a draft model of the same family (the same tokenizer)",
        )
    if _eos_ids(tokenizer) != main.info.eos_token_ids:
        raise ModelLoadError(
            f"the draft model {path} ends its turns with other tokens than {main.info.id}",
            hint="pick a draft model of the same family (the same tokenizer)",
        )
    return DraftLoaded(model=model, vocab_size=len(mine))
