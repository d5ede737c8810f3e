"""Which of a hub repo's files an MLX model needs, and whether the repo is one MLX can load.

A repo often carries the same weights several times (PyTorch `.bin`, GGUF, `original/`
checkpoints); MLX needs only the root-level `model*.safetensors`, the configs, and the
tokenizer and template files.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

# Root-level files to fetch. Weight files are matched separately (model*.safetensors).
MLX_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tiktoken.model",
    "*.tiktoken",
    "chat_template.json",
    "*.jinja",
    "tokenization_*.py",  # custom tokenizers some repos ship (mlx-lm loads them)
)
WEIGHT_PATTERN = "model*.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".gguf", ".onnx", ".h5", ".msgpack", ".ckpt")


def is_mlx_file(name: str) -> bool:
    """True when `name` (a repo path) is one of the files an MLX model needs."""
    if "/" in name:
        return False  # subfolders hold alternative formats (original/, onnx/, gguf/ ...)
    return fnmatch.fnmatch(name, WEIGHT_PATTERN) or any(
        fnmatch.fnmatch(name, p) for p in MLX_FILE_PATTERNS
    )


def select_mlx_files(names: Iterable[str]) -> list[str]:
    """The subset of `names` to download, in a stable order (small files first)."""
    chosen = [n for n in names if is_mlx_file(n)]
    # Config and tokenizer first: a pull cut short early still shows what the model is.
    return sorted(chosen, key=lambda n: (fnmatch.fnmatch(n, WEIGHT_PATTERN), n))


@dataclass(frozen=True)
class RepoCheck:
    """The verdict on a hub repo before download: what to fetch and why it may not load."""

    files: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def loadable(self) -> bool:
        """True when nothing stops mlx-lm from loading this repo."""
        return not self.problems


def check_repo_files(names: Iterable[str]) -> RepoCheck:
    """Judge a repo from its file list alone (config contents are checked separately)."""
    all_names = list(names)
    files = select_mlx_files(all_names)
    problems: list[str] = []
    if not any(fnmatch.fnmatch(n, WEIGHT_PATTERN) for n in files):
        others = sorted(
            {n.rsplit(".", 1)[-1] for n in all_names if n.endswith(OTHER_WEIGHT_SUFFIXES)}
        )
        found = f" (it has {', '.join('.' + o for o in others)} weights)" if others else ""
        problems.append(f"no safetensors weights{found}; MLX loads model*.safetensors only")
    if "config.json" not in files:
        problems.append("no config.json")
    has_tokenizer = any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in files)
    if not has_tokenizer:
        problems.append("no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    return RepoCheck(files=tuple(files), problems=tuple(problems))
