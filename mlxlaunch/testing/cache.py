"""Built-once test models, cached per machine (also what ``--model demo`` serves).

A model lives in ``<home>/test-models/<name>-<builder hash>``: the hash covers the builder's
own source, templates and training text, so editing any of them builds a fresh model instead
of serving a stale one. Builds go to a temporary directory renamed into place, under a file
lock, so concurrent test processes build each model once and never see half a directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs

from mlxlaunch.home import private_dir

HOME_ENV = "MLXLAUNCH_HOME"

DEMO_NOTICE = (
    "The demo model has random weights and answers from a script: a greeting, and a real Bash "
    "tool round trip when asked to create a file. It shows the plumbing without a download; "
    "pick a real model for real work (mlx models recommend)."
)


TEST_MODEL_NOTICE = (
    "{name} is a test model with random weights: its output is noise. It exists for tests and "
    "benchmarks; try `--model demo` for a scripted demo, or pick a real model for real work."
)


def notice_for_test_model(name: str) -> str:
    """What the user is told when serving a built-in test model."""
    return DEMO_NOTICE if name == "demo" else TEST_MODEL_NOTICE.format(name=name)


@dataclass(frozen=True)
class ModelRecipe:
    """How a named cached test model is built."""

    size: str
    template: str = "qwen"
    seed: int = 0
    weights: str = "random"  # or "copy" (testing/copying.py)
    vision: bool = False  # built by testing/vision.py (mlx-vlm's architecture), not builder.py


TEST_MODELS: dict[str, ModelRecipe] = {
    "tiny": ModelRecipe(size="tiny"),
    "small": ModelRecipe(size="small"),
    "medium": ModelRecipe(size="medium"),
    "large": ModelRecipe(size="large"),
    "tiny-moe": ModelRecipe(size="tiny-moe"),  # qwen3_moe: for sharding across ranks
    # Small prefills Claude Code's ~13k-token prompt in seconds on a CPU, so `mlx serve
    # --model demo` answers quickly while still running realistic shapes.
    "demo": ModelRecipe(size="small"),
    # Hand-wired to copy: its greedy output is a fixed chain of words, so drafts taken from
    # a prompt holding that text are accepted by its own forward passes (speculative decoding).
    "copy": ModelRecipe(size="small", weights="copy"),
    # The same chain in the tiny shape (same tokenizer and seed): a draft model for "copy".
    "copy-tiny": ModelRecipe(size="tiny", weights="copy"),
    # Qwen2.5-VL's architecture over tiny's text shape (testing/vision.py; needs mlx-vlm).
    "tiny-vision": ModelRecipe(size="tiny-vision", template="qwen_vl", vision=True),
}

# Files whose content decides what the builder writes.
_BUILDER_INPUTS = (
    "builder.py",
    "copying.py",
    "tokenizer.py",
    "templates.py",
    "cache.py",
    "vision.py",
)


def is_test_model_name(name: str) -> bool:
    """True when ``name`` names a model this module builds (``tiny``, ``demo``, ...)."""
    return name in TEST_MODELS


def cached_models_dir() -> Path:
    """The directory holding cached test models."""
    home = os.environ.get(HOME_ENV)
    base = Path(home) if home else Path(platformdirs.user_cache_dir("mlxlaunch"))
    return base / "test-models"


def builder_hash(recipe: ModelRecipe) -> str:
    """A short hash of everything that shapes the built model."""
    digest = hashlib.sha256(repr(recipe).encode())
    # The tokenizer trains on standard-library sources, which differ between Python versions.
    digest.update(f"py{sys.version_info.major}.{sys.version_info.minor}".encode())
    package = resources.files(__package__)
    inputs = [package.joinpath(name) for name in _BUILDER_INPUTS]
    inputs += sorted(package.joinpath("templates").iterdir(), key=lambda p: p.name)
    inputs += sorted(package.joinpath("data").iterdir(), key=lambda p: p.name)
    for item in inputs:
        if item.is_file():
            digest.update(item.name.encode())
            digest.update(item.read_bytes())
    return digest.hexdigest()[:12]


def ensure_test_model(name: str) -> Path:
    """Return the directory of the named test model, building it first if needed.

    Safe to call from several processes at once: one builds, the others wait and reuse it.

    Raises:
        ValueError: ``name`` is not a test model name.
    """
    try:
        recipe = TEST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown test model {name!r} (known: {sorted(TEST_MODELS)})") from None
    root = cached_models_dir()
    target = root / f"{name}-{builder_hash(recipe)}"
    if _is_complete(target):
        return target
    private_dir(root)  # the home and test-models: 0700 whatever the umask
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _is_complete(target):  # another process may have built it meanwhile
                _build_atomically(recipe, target, _built_twin(name, recipe, root))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _is_complete(directory: Path) -> bool:
    # The rename is the last step, so a directory with a config is a finished build.
    return (directory / "config.json").is_file()


def _built_twin(name: str, recipe: ModelRecipe, root: Path) -> Path | None:
    """A finished build of the same recipe under another name ("demo" is built as "small"):
    the recipe decides the files, so a copy of it saves building them again."""
    for other, twin in TEST_MODELS.items():
        if other == name or twin != recipe:
            continue
        path = root / f"{other}-{builder_hash(twin)}"
        if _is_complete(path):
            return path
    return None


def _build_atomically(recipe: ModelRecipe, target: Path, twin: Path | None = None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        if twin is not None:
            shutil.copytree(twin, staging, dirs_exist_ok=True)  # modes too (copy2, copystat)
        elif recipe.vision:
            from mlxlaunch.testing.vision import build_vision_model  # mlx-vlm: only here

            build_vision_model(staging, recipe.size, seed=recipe.seed)
        else:
            from mlxlaunch.testing.builder import build_model  # mlx: only when building

            build_model(
                staging,
                recipe.size,
                template=recipe.template,
                seed=recipe.seed,
                weights=recipe.weights,
            )
        if target.exists():  # a leftover without config.json: an interrupted old layout
            shutil.rmtree(target)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
