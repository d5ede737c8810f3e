"""The window a launch advertises is what the machine holds: the model's window capped by the
memory its KV needs at the chosen `--kv-bits`, as `mlx doctor` and `mlx models recommend` say.

Pure estimates from config.json and the catalog (no model loads); the engine's own cap, from
what it measures after loading, is tested in tests/test_kv_quantization.py and
tests/test_scheduler.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_doctor import HEALTHY

from mlxlaunch.cli.model_views import recommendation_json
from mlxlaunch.launch.doctor import ModelFact, run_checks
from mlxlaunch.store.catalog import catalog_entry
from mlxlaunch.store.compute import Compute
from mlxlaunch.store.memory import (
    GIB,
    RUNTIME_OVERHEAD_BYTES,
    KVShape,
    kv_shape_of,
    window_that_fits,
    windows_here,
)

QWEN3_CODER_30B = {  # its config.json, the parts that shape the KV
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "hidden_size": 2048,
    "max_position_embeddings": 262_144,
}


def test_kv_bytes_per_token_follow_the_config_and_the_bits() -> None:
    kv = kv_shape_of(QWEN3_CODER_30B)
    assert kv == KVShape(48, 4, 128)
    assert kv_shape_of({"text_config": QWEN3_CODER_30B}) == kv  # a vision model's nesting
    assert kv_shape_of({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}) == (
        KVShape(4, 8, 64)
    )
    assert kv_shape_of({}) is None
    per_token = {bits: kv.bytes_per_token(bits) for bits in (None, 8, 4)}
    print(f"\nQwen3-Coder-30B KV bytes per token at 16/8/4 bits: {per_token}")
    assert per_token[None] == 48 * 2 * 4 * 128 * 2  # 96 KiB
    # Packed bits, and a bfloat16 scale and bias per 64 values.
    assert per_token[8] == per_token[None] * (1 + 4 / 64) // 2
    assert per_token[4] == per_token[None] * (0.5 + 4 / 64) // 2


def test_the_window_is_capped_by_the_memory_left_beside_the_weights() -> None:
    per_token = 1000
    total = 10 * GIB
    free = int(total * 0.85) - 2 * GIB - RUNTIME_OVERHEAD_BYTES
    assert window_that_fits(10**9, 2 * GIB, per_token, total) == free // per_token
    assert window_that_fits(4096, 2 * GIB, per_token, total) == 4096  # the model's own
    assert window_that_fits(4096, 20 * GIB, per_token, total) == 0  # the weights alone overflow
    assert window_that_fits(4096, 2 * GIB, per_token, 0) == 4096  # memory unknown: not capped


def test_a_32_gib_mac_holds_more_of_qwen3_coder_at_fewer_kv_bits() -> None:
    entry = catalog_entry("qwen3-coder-30b")
    assert entry is not None and entry.kv == kv_shape_of(QWEN3_CODER_30B)
    here = windows_here(entry.context_window, entry.size_bytes, entry.kv, 32 * GIB)
    print(f"\nqwen3-coder-30b on 32 GiB, tokens that fit by KV bits: {here}")
    assert here[16] < here[8] < here[4] == entry.context_window
    assert 90_000 < here[16] < 120_000 and here[8] > 1.8 * here[16]
    data = recommendation_json(32 * GIB, "coder", Compute("metal", 10))
    assert data["alias"] == "qwen3-coder-30b"
    assert data["context_here"] == {str(bits): n for bits, n in here.items()}
    assert f"holds {here[16]:,} of its 262,144-token window" in data["context_here_text"]
    assert f"8-bit KV: {here[8]:,}" in data["context_here_text"]


def test_doctor_prints_the_window_each_model_gets_here() -> None:
    model = ModelFact("qwen3-coder", int(17.2e9), (), 262_144, kv_shape_of(QWEN3_CODER_30B))
    facts = replace(HEALTHY, total_memory=32 * GIB, models=(model,))
    found = {c.name: c for c in run_checks(facts)}["model qwen3-coder"].detail
    here = windows_here(262_144, int(17.2e9), model.kv, 32 * GIB)
    assert f"holds {here[16]:,} of its 262,144-token window" in found
    assert f"4-bit KV: {here[4]:,}" in found
    roomy = replace(HEALTHY, total_memory=512 * GIB, models=(model,))
    assert (
        "holds all of its 262,144-token window"
        in {c.name: c for c in run_checks(roomy)}["model qwen3-coder"].detail
    )


@pytest.mark.quick  # reads the tiny model's config.json (built once per session)
def test_a_launch_that_loads_later_advertises_what_fits(tiny_model_dir: Path) -> None:
    from mlxlaunch.launch.models import ChosenModel
    from mlxlaunch.store.facts import read_config, weight_files
    from mlxlaunch.store.memory import system_memory_bytes

    chosen = ChosenModel("tiny", tiny_model_dir, "--model")
    kv = kv_shape_of(read_config(tiny_model_dir))
    assert kv is not None
    weights = sum(f.stat().st_size for f in weight_files(tiny_model_dir))
    room = weights + RUNTIME_OVERHEAD_BYTES + 3000 * kv.bytes_per_token(None)
    share = (room + 1) / system_memory_bytes()  # memory for ~3,000 unquantized tokens
    assert 2990 <= chosen.context_window(memory_share=share) <= 3000
    eight = chosen.context_window(kv_bits=8, kv_group_size=32, memory_share=share)
    assert eight == int(3000 * kv.bytes_per_token(None) / kv.bytes_per_token(8, 32))
    assert chosen.context_window(memory_share=None) == 40_960  # the model's own, uncapped
    assert chosen.context_window(2048, memory_share=share) == 2048  # a smaller override
    # A small model served beside it (--small-model) takes its weights' room from the KV.
    beside = 1000 * kv.bytes_per_token(None)
    assert 1990 <= chosen.context_window(memory_share=share, beside_bytes=beside) <= 2000
