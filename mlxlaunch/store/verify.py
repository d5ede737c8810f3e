"""Check that a model directory will load — config, tokenizer, chat template, weight shapes —
without loading weights or running anything (the store never touches MLX).

A shard pull's directory (store/shards.py's marker) is checked for the files of its pipeline
ranks only: the other ranks' weights are meant to be absent.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mlxlaunch.store.facts import (
    TensorInfo,
    mlx_lm_model_module,
    quantization_bits,
    read_chat_template,
    read_config,
    read_safetensors_header,
    weight_files,
)
from mlxlaunch.store.shards import read_marker

LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
SAMPLE_TOOL = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@dataclass(frozen=True)
class VerifyReport:
    """What the check found: `problems` stop a load, `notes` are worth knowing."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when nothing stops mlx-lm from loading the model."""
        return not self.problems


def _check_file_lengths(file: Path) -> list[str]:
    """A safetensors file must be exactly header + the bytes its tensors claim (no truncation)."""
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    ends = [int(m["data_offsets"][1]) for k, m in header.items() if k != "__metadata__"]
    expected = 8 + length + (max(ends) if ends else 0)
    actual = file.stat().st_size
    if actual != expected:
        return [f"{file.name} is {actual} bytes, its header describes {expected}"]
    return []


def check_weights(path: Path, config: dict[str, Any]) -> tuple[list[str], list[TensorInfo]]:
    """Problems with the weight files, and every tensor they declare."""
    files = weight_files(path)
    if not files:
        return ["no model*.safetensors files"], []
    problems: list[str] = []
    tensors: list[TensorInfo] = []
    for f in files:
        try:
            problems += _check_file_lengths(f)
            tensors += read_safetensors_header(f)
        except (OSError, ValueError, KeyError, struct.error) as e:
            problems.append(f"{f.name} has an unreadable header ({e})")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            return [*problems, f"model.safetensors.index.json is unreadable ({e})"], tensors
        marker = read_marker(path)
        expected = set(marker.weight_files) if marker else set(weight_map.values())
        missing_files = sorted(f for f in expected if not (path / f).is_file())
        if missing_files:
            problems.append(f"missing weight shards: {', '.join(missing_files)}")
        declared = {t.name for t in tensors}
        absent = [k for k, f in weight_map.items() if f in expected and k not in declared]
        if absent and not missing_files:
            problems.append(f"{len(absent)} tensors in the index are in no file (e.g. {absent[0]})")
        if marker is not None:  # a pipeline shard holds some layers by design
            return problems, tensors
    problems += _check_shapes(config, tensors)
    return problems, tensors


def _check_shapes(config: dict[str, Any], tensors: list[TensorInfo]) -> list[str]:
    """Shapes the config implies: layer count and the embedding table."""
    text = config.get("text_config") or config
    problems: list[str] = []
    layers = {int(m.group(1)) for t in tensors if (m := LAYER_INDEX.search(t.name))}
    want_layers = text.get("num_hidden_layers")
    if isinstance(want_layers, int) and layers and len(layers) < want_layers:
        problems.append(f"weights hold {len(layers)} layers, config.json says {want_layers}")
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    embed = next((t for t in tensors if t.name.endswith("embed_tokens.weight")), None)
    if embed is not None and isinstance(vocab, int) and isinstance(hidden, int):
        bits = quantization_bits(config)
        width = hidden * bits // 32 if bits and embed.dtype == "U32" else hidden
        if embed.shape != (vocab, width):
            problems.append(
                f"embed_tokens is {list(embed.shape)}, config.json implies {[vocab, width]}"
            )
    return problems


def check_tokenizer(path: Path) -> list[str]:
    """The tokenizer must parse and encode text (tokenizer.json through `tokenizers`)."""
    file = path / "tokenizer.json"
    if not file.is_file():
        others = ("tokenizer.model", "vocab.json", "tiktoken.model")
        if any((path / n).is_file() for n in others) or any(path.glob("*.tiktoken")):
            return []
        return ["no tokenizer files"]
    try:
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(file)).encode("def hello():\n    return 42").ids
    except Exception as e:  # tokenizers raises its own exception types
        return [f"tokenizer.json does not load ({e})"]
    return [] if ids else ["the tokenizer encodes text to nothing"]


def render_template(template: str, *, tools: bool = True) -> str:
    """Render a chat template the way transformers does, with a short tool conversation."""
    from jinja2 import Undefined
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    # Lenient undefined, as in transformers: templates probe optional variables.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=Undefined)
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    messages = [
        {"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "List the files."},
    ]
    return env.from_string(template).render(
        messages=messages,
        tools=[SAMPLE_TOOL] if tools else None,
        add_generation_prompt=True,
        bos_token="",
        eos_token="",
    )


def check_template(path: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) from rendering the chat template with and without tools."""
    template = read_chat_template(path)
    if template is None:
        return [], ["no chat template: prompts will be plain text and tools unavailable"]
    try:
        render_template(template, tools=False)
    except Exception as e:  # any template error means the engine cannot build a prompt
        return [f"the chat template does not render ({type(e).__name__}: {e})"], []
    try:
        rendered = render_template(template, tools=True)
    except Exception as e:
        return [], [f"the chat template fails with tools ({type(e).__name__}: {e})"]
    notes = [] if "Bash" in rendered else ["the chat template ignores tool definitions"]
    return [], notes


def verify_model_dir(path: Path) -> VerifyReport:
    """Check every part mlx-lm needs, from files alone."""
    problems: list[str] = []
    notes: list[str] = []
    config = read_config(path)
    if not config:
        problems.append("config.json is missing or not JSON")
    elif mlx_lm_model_module(config) is None:
        problems.append(f"unsupported architecture '{config.get('model_type')}' (not in mlx-lm)")
    weight_problems, _ = check_weights(path, config)
    problems += weight_problems
    problems += check_tokenizer(path)
    template_problems, template_notes = check_template(path)
    if (marker := read_marker(path)) is not None:
        notes.append(
            f"shard {marker.spec.label}: only the weights of pipeline rank(s) "
            f"{marker.spec.label.split('/')[0]} of {marker.spec.size} (serve it with --hosts)"
        )
    return VerifyReport(tuple(problems + template_problems), tuple(notes + template_notes))
