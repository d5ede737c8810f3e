"""A hub cache written file by file, without a hub or mlx: deterministic local models for CLI
tests (names, sizes, commits and facts never vary between machines or runs).

Only headers are real: a safetensors file holds its JSON header and no tensor data, which is
all `mlxlaunch.store.facts` reads.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system' }}{%- for tool in tools %}{{ tool | tojson }}"
    "{%- endfor %}{%- endif %}{%- for message in messages %}{%- if message.tool_calls %}"
    "<tool_call>{{ tool_call.name }}</tool_call>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant{%- if enable_thinking is defined "
    "and enable_thinking is false %}<think>\n\n</think>{%- endif %}{%- endif %}"
)


def safetensors_header(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file's bytes with these (dtype, shape) tensors listed and no data."""
    header = {
        name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
        for name, (dtype, shape) in tensors.items()
    }
    raw = json.dumps(header, sort_keys=True).encode()
    return struct.pack("<Q", len(raw)) + raw


def quantized_files(params: int, bits: int, context: int) -> dict[str, bytes]:
    """A qwen3 model of `params` parameters quantized to `bits`, with tools and thinking."""
    config: dict[str, Any] = {
        "model_type": "qwen3",
        "max_position_embeddings": context,
        "quantization": {"bits": bits, "group_size": 64},
    }
    packed = params * bits // 32
    weights = safetensors_header({
        "model.layers.0.mlp.weight": ("U32", [packed // 1000, 1000]),
        "model.layers.0.mlp.scales": ("BF16", [packed // 1000, 16]),
        "model.layers.0.mlp.biases": ("BF16", [packed // 1000, 16]),
    })  # fmt: skip
    tokenizer = {
        "added_tokens": [{"content": "<think>", "id": 1}, {"content": "</think>", "id": 2}]
    }
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": weights,
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "chat_template.jinja": QWEN_TEMPLATE.encode(),
    }


def write_hub_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """`files` as the `main` snapshot of `repo_id` in the hub cache at `cache`; its directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def write_store(cache: Path) -> None:
    """Three models: two catalog models (by alias) and an incomplete unquantized one."""
    write_hub_repo(cache, "mlx-community/Qwen3-4B-4bit", quantized_files(4_000_000_000, 4, 40_960))
    write_hub_repo(
        cache,
        "mlx-community/Qwen2.5-Coder-7B-Instruct-4bit",
        quantized_files(7_600_000_000, 4, 32_768),
    )
    plain = {
        "config.json": json.dumps(
            {"model_type": "llama", "max_position_embeddings": 8192}
        ).encode(),
        "model.safetensors": safetensors_header({"model.embed.weight": ("BF16", [32000, 4096])}),
    }
    write_hub_repo(cache, "test-org/Llama-Finetune-bf16", plain)  # no tokenizer: incomplete
