"""Build a vision model offline: Qwen2.5-VL's architecture (mlx-vlm's `qwen2_5_vl`), tiny.

Random weights, the project's own BPE tokenizer with Qwen's vision tokens, a chat template
that places image parts, and a real `preprocessor_config.json` for mlx-vlm's Qwen image
processor, so preprocessing (resize to the patch grid, normalisation), the placement of
image tokens, the vision tower and the merge into the text embeddings all run the real code.
mlx-lm loads the same directory as a text-only model (its `qwen2_vl` drops the tower).

Needs mlx-vlm (the `vision` extra) only to build: the weight names come from its model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxlaunch.home import shared_dir
from mlxlaunch.testing.builder import (
    BPE_VOCAB_SIZE,
    CONTEXT_WINDOW,
    MODEL_SIZES,
    PROJECTION_SCALE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    settle_modes,
    weights_index,
    write_json,
)
from mlxlaunch.testing.templates import template_family
from mlxlaunch.testing.tokenizer import write_tokenizer

# Qwen2.5-VL's tower in miniature: 14-pixel patches, 2x2 merged into one token, so an image
# costs (h/28)·(w/28) tokens; the pixel bounds keep a test image at 4-64 tokens.
VISION_SIZES = ("tiny-vision",)
PATCH = 14
MERGE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64
# CLIP's normalisation, which Qwen2.5-VL's processor uses.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def vision_config(text: dict[str, Any], token_ids: dict[str, int]) -> dict[str, Any]:
    """The `config.json` of a tiny qwen2_5_vl model over the text model config `text`."""
    half = text["hidden_size"] // text["num_attention_heads"] // 2
    return {
        **text,
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        # Rotary halves for (time, height, width), in Qwen2.5-VL's proportions (16, 24, 24).
        "rope_scaling": {
            "type": "mrope",
            "mrope_section": [half // 4, half * 3 // 8, half * 3 // 8],
        },
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": text["hidden_size"],
            "in_channels": 3,
            "patch_size": PATCH,
            "spatial_patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
            "window_size": 4 * PATCH * MERGE,
            "fullatt_block_indexes": [0],
            "tokens_per_second": 2,
        },
    }


def preprocessor_config() -> dict[str, Any]:
    """What mlx-vlm's Qwen image processor reads (`preprocessor_config.json`)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": PATCH,
        "temporal_patch_size": 2,
        "merge_size": MERGE,
        "image_mean": list(IMAGE_MEAN),
        "image_std": list(IMAGE_STD),
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }


def build_vision_model(path: Path, size: str = "tiny-vision", *, seed: int = 0) -> Path:
    """Write a model directory that `mlx_vlm.load(path)` loads as a vision model (and
    `mlx_lm.load(path)` as a text-only one); the text part has the `tiny` shape.

    Raises:
        ValueError: `size` is not one of `VISION_SIZES`.
        ImportError: mlx-vlm is not installed (`pip install 'mlxlaunch[vision]'`).
    """
    if size not in VISION_SIZES:
        raise ValueError(f"unknown vision test model size {size!r} (known: {VISION_SIZES})")
    from mlx_vlm.models import qwen2_5_vl  # the `vision` extra

    from mlxlaunch.testing.builder import model_config

    family = template_family("qwen_vl")
    path = shared_dir(Path(path))
    existing = {entry.name for entry in path.iterdir()}
    tokenizer = write_tokenizer(path, family, BPE_VOCAB_SIZE, CONTEXT_WINDOW)
    ids: dict[str, int] = {}
    for token in family.control_tokens:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        ids[token] = token_id
    text = model_config(MODEL_SIZES["tiny"], tokenizer.get_vocab_size(), ids[family.eos_token])
    text = {k: v for k, v in text.items() if k not in ("model_type", "architectures")}
    config = vision_config(text, ids)

    mx.random.seed(seed)
    args = qwen2_5_vl.ModelConfig.from_dict(json.loads(json.dumps(config)))
    args.vision_config = qwen2_5_vl.VisionConfig.from_dict(config["vision_config"])
    args.text_config = qwen2_5_vl.TextConfig.from_dict(args.text_config)
    model = qwen2_5_vl.Model(args)
    tensors = {  # as in builder.py: projections scaled so the output depends on the input
        name: value * PROJECTION_SCALE if name.endswith("proj.weight") else value
        for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    }
    mx.save_safetensors(str(path / WEIGHTS_FILE), tensors, metadata={"format": "mlx"})
    write_json(path / WEIGHTS_INDEX_FILE, weights_index(tensors, WEIGHTS_FILE))
    write_json(path / "config.json", config)
    write_json(path / "preprocessor_config.json", preprocessor_config())
    settle_modes(path, existing)
    return path
