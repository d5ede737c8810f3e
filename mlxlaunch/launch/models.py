"""Which model `mlx launch claude` serves: --model, the configured default, or the best local one.

Names resolve in one order everywhere: the built-in test models (`demo`, `tiny`, `small`, …) are
built offline on first use; everything else goes through the store's resolver, which never
downloads. This is the one product module that imports `mlxlaunch.testing` (tests/test_rooms.py
holds it to that): the rest of the product asks here about test model names and the demo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlxlaunch.config import UserConfig
from mlxlaunch.engine.settings import context_window_of
from mlxlaunch.errors import DefaultModelMissing, ModelNotFound
from mlxlaunch.store.catalog import catalog_entry, recommend
from mlxlaunch.store.facts import read_config, weights_size
from mlxlaunch.store.inventory import LocalModel, list_models
from mlxlaunch.store.memory import (
    DEFAULT_KV_GROUP_SIZE,
    ENGINE_MEMORY_SHARE,
    kv_shape_of,
    memory_fit,
    window_that_fits,
)
from mlxlaunch.store.resolve import is_repo_id, resolve_model
from mlxlaunch.testing import (
    TEST_MODELS,
    ensure_test_model,
    is_test_model_name,
    notice_for_test_model,
)

if TYPE_CHECKING:
    from mlxlaunch.testing.demo import DemoReplies


def test_model_sizes() -> list[str]:
    """The sizes offline test models come in."""
    from mlxlaunch.testing.builder import MODEL_SIZES

    return list(MODEL_SIZES)


def build_real_template_model(directory: Path, size: str, family: str) -> Path:
    """A random-weight test model with a real model's chat template (benchmarks)."""
    from mlxlaunch.testing.builder import build_real_template_model as build

    return build(directory, size, family)


def copy_model_text(model_dir: Path, words: int, *, edit_every: int = 0) -> str:
    """Text a copy test model (`copy`, `copy-tiny`) in `model_dir` rewrites when asked to:
    its chain's first `words` words, every `edit_every`-th changed (benchmarks)."""
    from tokenizers import Tokenizer

    from mlxlaunch.testing.copying import chain_text, load_chain

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return chain_text(tokenizer, load_chain(model_dir), words, edit_every=edit_every)


__all__ = [
    "DEMO_MODEL",
    "ChosenModel",
    "best_local_model",
    "checked_model_name",
    "choose_model",
    "copy_model_text",
    "demo_replies",
    "is_test_model_name",
    "notice_for_test_model",
    "offline_model_dir",
    "offline_model_names",
    "pull_command",
    "pullable",
    "resolve_name",
]


@dataclass(frozen=True)
class ChosenModel:
    """The model to serve, where it lives, and why it was picked."""

    name: str  # what the user typed or what we picked: alias, repo id, path or test name
    path: Path
    reason: str  # "--model", "default-model setting" or "best downloaded model"

    @property
    def served_id(self) -> str:
        """The model id Claude Code is told: the name, or a directory's own name for paths."""
        if self.name.startswith(("/", ".", "~")):
            return Path(self.name).expanduser().resolve().name or self.name
        return self.name

    def context_window(
        self,
        override: int | None = None,
        kv_bits: int | None = None,
        kv_group_size: int | None = None,
        memory_share: float | None = ENGINE_MEMORY_SHARE,
        beside_bytes: int = 0,
    ) -> int:
        """The window the engine will serve, read from config.json without loading weights:
        the model's (or `override`), capped by the KV of how many tokens fit beside the
        weights (and `beside_bytes` of other models' weights served with it) in
        `memory_share` of RAM (None: not capped), KV held at `kv_bits`."""
        config = read_config(self.path)
        window = context_window_of(config, override)
        kv = kv_shape_of(config)
        if kv is None or memory_share is None:
            return window
        weights = weights_size(self.path) + beside_bytes
        per_token = kv.bytes_per_token(kv_bits, kv_group_size or DEFAULT_KV_GROUP_SIZE)
        return max(2, window_that_fits(window, weights, per_token, share=memory_share))


def resolve_name(name: str) -> Path:
    """The directory for a model name; builds test models, never downloads.

    Raises:
        ModelNotFound: nothing local matches (the hint says how to pull it).
    """
    if is_test_model_name(name):
        return ensure_test_model(name)
    return resolve_model(name, record_use=True).path


def offline_model_names() -> list[str]:
    """The built-in test models (`tiny`, `small`, …, `demo`): names that need no download."""
    return list(TEST_MODELS)


def offline_model_dir(name: str) -> Path:
    """Where the test model `name` is (or will be) built; no build happens here."""
    from mlxlaunch.testing.cache import builder_hash, cached_models_dir

    # The layout `ensure_test_model` builds into (a test keeps the two in step).
    return cached_models_dir() / f"{name}-{builder_hash(TEST_MODELS[name])}"


def best_local_model(
    models: Sequence[LocalModel], total_memory: int | None = None
) -> LocalModel | None:
    """The best complete, loadable local model that fits in memory.

    Catalog models rank by the catalog's quality order; among equals (and for models outside
    the catalog) the bigger one wins, since on a machine where both fit it is usually better.
    """

    def rank(model: LocalModel) -> tuple[int, int]:
        entry = catalog_entry(model.alias) if model.alias else None
        return (entry.rank if entry else 0, model.facts.weights_bytes)

    usable = [
        m
        for m in models
        if m.complete
        and not m.facts.problems()
        and memory_fit(m.facts.weights_bytes, total_memory).fits
    ]
    return max(usable, key=rank) if usable else None


def pullable(name: str) -> bool:
    """True when `name` is something `mlx models pull` fetches: a catalog alias or a hub repo
    id (not a test model, a path or a registered name)."""
    if is_test_model_name(name) or name.startswith((".", "/", "~")):
        return False
    return catalog_entry(name) is not None or is_repo_id(name)


def pull_command(total_memory: int | None = None) -> str | None:
    """The command that downloads the recommended model for this machine."""
    entry = recommend(total_memory)
    return f"mlx models pull {entry.alias}" if entry else None


def choose_model(
    explicit: str | None,
    config: UserConfig,
    *,
    local_models: Callable[[], Sequence[LocalModel]] = list_models,
    total_memory: int | None = None,
) -> ChosenModel:
    """Pick and resolve the model: --model, else default-model, else the best local model.

    Raises:
        ModelNotFound: no name was given and nothing suitable is downloaded; the hint is the
            exact command that pulls the recommended model.
    """
    if explicit:
        return ChosenModel(explicit, resolve_name(explicit), "--model")
    if config.default_model:
        return ChosenModel(
            config.default_model, _default_model_dir(config), "default-model setting"
        )
    best = best_local_model(local_models(), total_memory)
    if best is not None:
        return ChosenModel(best.name, best.path, "best downloaded model")
    command = pull_command(total_memory)
    raise ModelNotFound(
        "no model to launch: none given with --model, no default-model set, "
        "and no downloaded model fits in memory",
        hint=(f"download the recommended one: {command}" if command else "see mlx models catalog")
        + "  (or try the offline demo: mlx launch claude --model demo)",
    )


def _default_model_dir(config: UserConfig) -> Path:
    """The default-model setting's directory; a failure says the name came from the setting."""
    name = config.default_model or ""
    try:
        return resolve_name(name)
    except ModelNotFound as exc:
        raise DefaultModelMissing(exc, name, f" in {config.path}" if config.path else "") from exc


def checked_model_name(name: str) -> tuple[str, bool]:
    """What `mlx config set default-model NAME` stores, and whether that model is downloaded.

    A test model, a catalog alias or an `org/repo` id is kept as given (an alias or repo need
    not be downloaded yet); a directory is stored as its absolute path, so the setting means
    the same from any folder; a registered name as it is.

    Raises:
        ModelNotFound: nothing `mlx launch --model NAME` could serve, now or after a pull.
    """
    if is_test_model_name(name):
        return name, True
    if pullable(name):
        try:
            resolve_model(name)
        except ModelNotFound:
            return name, False
        return name, True
    resolved = resolve_model(name)  # a directory or a registered name, else ModelNotFound
    return (str(resolved.path) if resolved.source == "path" else name), True


DEMO_MODEL = "demo"


def demo_replies(
    name: str, total_memory: int | None = None, agent: str | None = None
) -> DemoReplies | None:
    """The scripted replies `--model demo` answers with (None for every other model): its
    weights are random, so unscripted it would write noise until its output cap. `agent`:
    the agent `mlx launch` runs, which its greeting names (None: any client of `mlx serve`)."""
    if name != DEMO_MODEL:
        return None
    from mlxlaunch.testing.demo import DemoReplies  # imports mlx: only when serving the demo

    return DemoReplies(pull_hint=pull_command(total_memory), agent=agent)
