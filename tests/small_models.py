"""Models built in memory for tests of the batch itself: real mlx-lm code, milliseconds a step.

The batch (engine/scheduling/batch.py) needs only a model object, no tokenizer or directory, so
these tests run in the quick tier. Weights are random, scaled up as the test-model builder
scales them (mlxlaunch/testing/builder.py) so that the output depends on the whole context.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache

from mlxlaunch.testing.builder import PROJECTION_SCALE


def random_qwen3(
    *, vocab: int = 96, hidden: int = 32, layers: int = 2, seed: int = 0, scale: float = 1.0
) -> Any:
    """A qwen3 model with random weights; `scale` multiplies the output logits (a larger
    one makes sampling nearly greedy, a smaller one spreads it)."""
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        head_dim=hidden // 4,
        tie_word_embeddings=True,
        rope_theta=10_000.0,
    )
    mx.random.seed(seed)
    model = qwen3.Model(args)
    weights = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    scaled = [
        (name, value * PROJECTION_SCALE if name.endswith("proj.weight") else value)
        for name, value in weights
    ]
    if scale != 1.0:
        scaled = [
            (name, value * scale if name == "model.norm.weight" else value)
            for name, value in scaled
        ]
    model.update(tree_unflatten(scaled))
    mx.eval(model.parameters())
    return model


def fresh_cache(model: Any) -> list[Any]:
    return list(make_prompt_cache(model))
