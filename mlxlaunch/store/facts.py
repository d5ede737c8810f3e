"""Model facts read from a model's files only — config, safetensors headers, tokenizer files.

Nothing here loads weights or builds a tokenizer: a 30 GB model's facts cost a few kilobytes of
reads. `engine/` may use these facts; they are the same ones `mlx models list/info` show.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxlaunch.store.dialects import detect_dialect
from mlxlaunch.store.generation_config import NO_DEFAULTS, SamplingDefaults, read_sampling_defaults
from mlxlaunch.store.memory import KVShape, kv_shape_of

# Files that make a directory a tokenizer mlx-lm can load (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
THINK_MARKERS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"))


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry in a safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TemplateFeatures:
    """What the chat template can render, read from its source text."""

    present: bool = False
    tools: bool = False
    thinking_toggle: bool = False  # honours `enable_thinking`
    system_role: bool = False
    generation_prompt: bool = False

    def names(self) -> list[str]:
        """The supported features as short words, for tables."""
        flags = {
            "tools": self.tools,
            "thinking-toggle": self.thinking_toggle,
            "system": self.system_role,
            "generation-prompt": self.generation_prompt,
        }
        return [name for name, on in flags.items() if on]


@dataclass(frozen=True)
class ModelFacts:
    """Everything the store knows about a model directory without loading it."""

    path: Path
    model_type: str | None
    architecture_supported: bool
    weights_bytes: int
    weight_files: tuple[str, ...]
    param_count: int | None
    quant_bits: int | None
    dtype: str | None
    context_window: int | None
    has_tokenizer: bool
    tool_format: str | None
    thinking: bool
    template: TemplateFeatures = field(default_factory=TemplateFeatures)
    sampling_defaults: SamplingDefaults = NO_DEFAULTS  # generation_config.json's
    kv: KVShape | None = None  # what one token's KV holds (config.json's layers and heads)
    vision: bool = False  # a vision model: config.json describes a vision tower

    def problems(self) -> list[str]:
        """Reasons mlx-lm could not load this model; empty when it looks loadable."""
        found: list[str] = []
        if not self.weight_files:
            found.append("no safetensors weights (MLX loads model*.safetensors only)")
        if self.model_type is None:
            found.append("config.json is missing or has no model_type")
        elif not self.architecture_supported:
            found.append(f"unsupported architecture '{self.model_type}' (not in mlx-lm)")
        if not self.has_tokenizer:
            found.append("no tokenizer files (tokenizer.json / tokenizer.model / vocab.json)")
        return found


def read_config(path: Path) -> dict[str, Any]:
    """The model's config.json as a dict ({} when absent or unreadable)."""
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def mlx_lm_models_dir() -> Path | None:
    """mlx-lm's `models/` directory, found without importing mlx-lm (the store stays mlx-free)."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


@functools.lru_cache(maxsize=1)
def mlx_lm_remapping() -> dict[str, str]:
    """mlx-lm's MODEL_REMAPPING (e.g. mistral -> llama), read from its source as a literal."""
    models = mlx_lm_models_dir()
    if models is None:
        return {}
    try:
        tree = ast.parse((models.parent / "utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in value.items()}
    return {}


def mlx_lm_model_module(config: dict[str, Any]) -> str | None:
    """The mlx-lm module name for this config's architecture, or None if mlx-lm has none.

    The test is the one mlx-lm itself applies: `mlx_lm/models/<model_type>.py` must exist
    (after mlx-lm's renames).
    """
    model_type = config.get("model_type")
    models = mlx_lm_models_dir()
    if not isinstance(model_type, str) or not model_type.isidentifier() or models is None:
        return None
    module = mlx_lm_remapping().get(model_type, model_type)
    return module if (models / f"{module}.py").is_file() else None


def read_safetensors_header(file: Path) -> list[TensorInfo]:
    """The tensors listed in a safetensors file's JSON header (reads only the header)."""
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return [
        TensorInfo(name, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]))
        for name, meta in header.items()
        if name != "__metadata__"
    ]


def weight_files(path: Path) -> list[Path]:
    """The weight files mlx-lm would load from `path` (it globs model*.safetensors)."""
    return sorted(path.glob("model*.safetensors"))


def weights_size(path: Path) -> int:
    """Bytes of the weight files at `path` (0 where there are none, e.g. a hub id)."""
    return sum(f.stat().st_size for f in weight_files(path))


def count_parameters(tensors: list[TensorInfo], quant_bits: int | None) -> int:
    """Parameters of the unquantised model: packed uint32 weights hold 32/bits values each."""
    names = {t.name for t in tensors}
    total = 0
    for t in tensors:
        stem = t.name.rsplit(".", 1)[0]
        if t.name.endswith((".scales", ".biases")) and f"{stem}.weight" in names:
            continue  # quantisation bookkeeping, not parameters
        n = math.prod(t.shape)
        if quant_bits and t.dtype == "U32" and f"{stem}.scales" in names:
            n = n * 32 // quant_bits
        total += n
    return total


def quantization_bits(config: dict[str, Any]) -> int | None:
    """Bits per weight when the config says the model is quantised."""
    for key in ("quantization", "quantization_config"):
        q = config.get(key)
        if isinstance(q, dict) and isinstance(q.get("bits"), int):
            return int(q["bits"])
    return None


# Keys a config.json states its trained context length under, in the order they are trusted.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "n_ctx",
)


def context_window(config: dict[str, Any]) -> int | None:
    """The model's trained context length from its config, if it states one.

    The one rule for it: `mlx models` shows this, and the engine serves it (see
    `mlxlaunch.engine.settings.context_window_of`, which adds the override and a fallback).
    """
    sources = [config, config.get("text_config") or {}]
    for source in sources:
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def read_chat_template(path: Path) -> str | None:
    """The chat template, from chat_template.jinja, chat_template.json or tokenizer_config.json."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        template = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(template, list):  # named templates: use the default one
            by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = by_name.get("default") or next(iter(by_name.values()), None)
        if isinstance(template, str):
            return template
    return None


def read_special_vocab(path: Path) -> dict[str, int]:
    """Added (special) tokens from tokenizer.json / tokenizer_config.json: content -> id."""
    vocab: dict[str, int] = {}
    try:
        data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        for tok in data.get("added_tokens", []):
            vocab[str(tok["content"])] = int(tok["id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        data = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        for tid, tok in (data.get("added_tokens_decoder") or {}).items():
            vocab.setdefault(str(tok["content"]), int(tid))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return vocab


def infer_tool_format(chat_template: str | None, vocab: dict[str, int]) -> str | None:
    """The tool-call format of this template/vocab (e.g. 'json_tools', 'harmony'), or None."""
    dialect = detect_dialect(chat_template, vocab)
    return None if dialect is None or dialect.name == "none" else dialect.name


def template_features(template: str | None) -> TemplateFeatures:
    """What a chat template can do, judged from the variables and markup it uses."""
    if not template:
        return TemplateFeatures()
    return TemplateFeatures(
        present=True,
        tools="tools" in template,
        thinking_toggle="enable_thinking" in template or "thinking" in template,
        system_role="system" in template,
        generation_prompt="add_generation_prompt" in template,
    )


def read_facts(path: Path) -> ModelFacts:
    """Read every fact about the model directory `path` from its files."""
    config = read_config(path)
    bits = quantization_bits(config)
    files = weight_files(path)
    tensors: list[TensorInfo] = []
    for f in files:
        try:
            tensors.extend(read_safetensors_header(f))
        except (OSError, ValueError, struct.error):
            continue  # a truncated file: size still counts, parameters unknown
    dtypes = {t.dtype for t in tensors if not t.name.endswith((".scales", ".biases"))}
    float_dtypes = sorted(d for d in dtypes if d.startswith(("F", "BF")))
    template = read_chat_template(path)
    vocab = read_special_vocab(path)
    model_type = config.get("model_type")
    return ModelFacts(
        path=path,
        model_type=model_type if isinstance(model_type, str) else None,
        architecture_supported=mlx_lm_model_module(config) is not None,
        weights_bytes=sum(f.stat().st_size for f in files),
        weight_files=tuple(f.name for f in files),
        param_count=count_parameters(tensors, bits) if tensors else None,
        quant_bits=bits,
        dtype=float_dtypes[0].lower() if float_dtypes else None,
        context_window=context_window(config),
        has_tokenizer=any((path / name).is_file() for name in TOKENIZER_FILES)
        or any(path.glob("*.tiktoken")),
        tool_format=infer_tool_format(template, vocab),
        thinking=any(a in vocab and b in vocab for a, b in THINK_MARKERS)
        or bool(template and "<think>" in template),
        template=template_features(template),
        sampling_defaults=read_sampling_defaults(path),
        kv=kv_shape_of(config),
        vision=isinstance(config.get("vision_config"), dict),
    )
