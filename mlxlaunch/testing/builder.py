"""Build real mlx-lm model directories offline: qwen3 (dense) or qwen3_moe, random weights.

The output is noise, but loading, templating, tokenizing, caching, batching and streaming run
the same code as with a downloaded model, and speed depends only on the shapes chosen here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3, qwen3_moe

from mlxlaunch.home import shared_dir
from mlxlaunch.testing.copying import chain_words, save_chain, wire_copy_weights
from mlxlaunch.testing.templates import TemplateFamily, real_template_family, template_family
from mlxlaunch.testing.tokenizer import write_tokenizer

CONTEXT_WINDOW = 40960
# Learned BPE entries (added tokens come on top). 8k keeps Claude Code's ~20k-token system
# prompt and tools near 13k tokens; 16k gains only ~10% more and the corpus runs out of merges.
BPE_VOCAB_SIZE = 8192
# Random projections at mlx's default scale leave the residual stream dominated by the input
# embedding, so greedy decoding settles on one token ("\n\n") whatever the prompt. Scaling
# them up lets attention and the MLP steer the output: greedy text varies with the context,
# which tests of exact cache reuse need to be meaningful.
PROJECTION_SCALE = 4.0


@dataclass(frozen=True)
class Experts:
    """The mixture-of-experts block of a qwen3_moe test model (the Qwen3-30B-A3B design)."""

    count: int
    per_token: int
    intermediate: int  # of each expert's MLP


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of one test-model size; with `experts`, every layer is a MoE layer."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    experts: Experts | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def model_type(self) -> str:
        return "qwen3" if self.experts is None else "qwen3_moe"


# Prefill cost grows with layers x width x prompt length squared; keep these cheap.
MODEL_SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(layers=1, hidden=64, heads=2, kv_heads=1, intermediate=128),
    "small": ModelShape(layers=1, hidden=256, heads=4, kv_heads=2, intermediate=512),
    "medium": ModelShape(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256),
    # For benchmarks, not tests: four times medium's attention per token, so a prefill of a
    # few new tokens over a long cache costs what it does on a real model relative to a
    # server's fixed per-request costs (about 20 s for a cold 12.6k-token prompt here).
    "large": ModelShape(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=512),
    # For sharding tests (mlx.launch, sharded_load): the MoE architecture the models too big
    # for one Mac share. Head counts divide by 2 for tensor parallelism; 4 layers split over
    # 2 or 3 pipeline ranks.
    "tiny-moe": ModelShape(
        layers=4,
        hidden=64,
        heads=4,
        kv_heads=2,
        intermediate=128,
        experts=Experts(count=4, per_token=2, intermediate=64),
    ),
}


def model_config(
    shape: ModelShape, vocab_size: int, eos_token_id: int | list[int]
) -> dict[str, Any]:
    """The ``config.json`` mlx-lm reads to instantiate a qwen3 or qwen3_moe model."""
    config: dict[str, Any] = {
        "model_type": shape.model_type,
        "architectures": ["Qwen3ForCausalLM" if shape.experts is None else "Qwen3MoeForCausalLM"],
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": CONTEXT_WINDOW,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "eos_token_id": eos_token_id,
        "bos_token_id": None,
        "torch_dtype": "float32",
    }
    if shape.experts is not None:
        config |= {
            "num_experts": shape.experts.count,
            "num_experts_per_tok": shape.experts.per_token,
            "moe_intermediate_size": shape.experts.intermediate,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
        }
    return config


def build_model(
    path: Path,
    size: str = "tiny",
    *,
    template: str | TemplateFamily = "qwen",
    seed: int = 0,
    weights: str = "random",
) -> Path:
    """Write a model directory that ``mlx_lm.load(path)`` loads.

    Args:
        path: directory to write into (created if missing; existing files are overwritten).
        size: one of :data:`MODEL_SIZES` (``"tiny"``, ``"small"``, ``"medium"``, ...;
            ``"tiny-moe"`` is a qwen3_moe model).
        template: chat-template family from ``mlxlaunch.testing.templates`` (a name, or a
            family such as ``real_template_family(path)`` gives).
        seed: seed for the random weights.
        weights: "random", or "copy": hand-wired to follow a chain of words (testing/copying.py;
            qwen3 sizes only).

    Returns:
        ``path``.
    """
    try:
        shape = MODEL_SIZES[size]
    except KeyError:
        raise ValueError(
            f"unknown test model size {size!r} (known: {sorted(MODEL_SIZES)})"
        ) from None
    family = template if isinstance(template, TemplateFamily) else template_family(template)
    path = shared_dir(Path(path))
    existing = {entry.name for entry in path.iterdir()}

    tokenizer = write_tokenizer(path, family, BPE_VOCAB_SIZE, CONTEXT_WINDOW)
    stop_ids: list[int] = []
    for token in family.stop_tokens:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:  # the family's added tokens must include its EOS
            raise ValueError(f"template {family.name!r}: EOS token {token!r} not in vocabulary")
        stop_ids.append(token_id)
    eos_token_id: int | list[int] = stop_ids[0] if len(stop_ids) == 1 else stop_ids
    config = model_config(shape, tokenizer.get_vocab_size(), eos_token_id)
    copying = weights == "copy"
    if copying:
        if shape.experts is not None:
            raise ValueError("a copy model is a dense qwen3 model")
        config["tie_word_embeddings"] = False  # its own output rows (testing/copying.py)

    mx.random.seed(seed)
    architecture = qwen3 if shape.experts is None else qwen3_moe
    model = architecture.Model(architecture.ModelArgs.from_dict(config))
    if copying:
        chain = chain_words(tokenizer, seed)
        tensors = wire_copy_weights(model, chain, seed)
        save_chain(path, chain)
    else:
        parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
        # Experts' projections (switch_mlp.*_proj) scale too; the router (mlp.gate) does not.
        tensors = {
            name: value * PROJECTION_SCALE if name.endswith("proj.weight") else value
            for name, value in parameters
        }
    mx.save_safetensors(str(path / WEIGHTS_FILE), tensors, metadata={"format": "mlx"})
    write_json(path / WEIGHTS_INDEX_FILE, weights_index(tensors, WEIGHTS_FILE))
    write_json(path / "config.json", config)
    settle_modes(path, existing)
    return path


WEIGHTS_FILE = "model.safetensors"
# What `sharded_load` reads to fetch and load only a pipeline rank's layers (as in a
# downloaded checkpoint); without it pipeline loading fails.
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


def weights_index(weights: dict[str, mx.array], file: str) -> dict[str, Any]:
    """The Hugging Face index of a checkpoint whose tensors all lie in `file`."""
    return {
        "metadata": {"total_size": sum(value.nbytes for value in weights.values())},
        "weight_map": {name: file for name in sorted(weights)},
    }


def write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


MODEL_FILE_MODE = 0o644  # readable by all, writable by this user (like SHARED_DIR_MODE)


def settle_modes(path: Path, existing: set[str]) -> None:
    """Give the files this build created 0644: mlx and tokenizers write with the umask's
    mode, which under `umask 000` lets anyone rewrite the weights. Files that were there
    before keep the mode their owner gave them."""
    for entry in path.iterdir():
        if entry.name not in existing and entry.is_file() and not entry.is_symlink():
            os.chmod(entry, MODEL_FILE_MODE)


# Real chat templates shipped with the package (copies of fixtures), for benchmarks.
REAL_TEMPLATES_DIR = ("templates", "real")


def build_real_template_model(directory: Path, size: str, family: str) -> Path:
    """A test model of `size` with the shipped real chat template of `family` (e.g.
    "qwen3-0.6b") and its tokens, in `directory / "model"`; returns that directory."""
    source = resources.files("mlxlaunch.testing").joinpath(*REAL_TEMPLATES_DIR)
    # The facts file must lie next to the template: copied out, which also works when the
    # package is imported from a zip.
    template_dir = shared_dir(directory / "template")
    for name in (f"{family}.jinja", f"{family}.tokens.json"):
        (template_dir / name).write_bytes(source.joinpath(name).read_bytes())
        os.chmod(template_dir / name, MODEL_FILE_MODE)
    model_dir = directory / "model"
    build_model(model_dir, size, template=real_template_family(template_dir / f"{family}.jinja"))
    return model_dir
