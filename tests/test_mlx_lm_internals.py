"""A tripwire for mlx-lm upgrades: every private name engine/runtime relies on is still there.

The names are listed once, in `mlxlaunch.engine.runtime.mlx_lm_internals.PRIVATE_NAMES`; each
is looked up on a real mlx-lm object built on the tiny test model. A failure names the
attribute and the installed mlx-lm version.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load_model
from transformers import PreTrainedTokenizerFast

from mlxlaunch.engine.runtime.mlx_lm_internals import (
    PRIVATE_NAMES,
    PrivateName,
    base_attention,
    batch_cache_holding,
    bound_attention,
    hf_tokenizer_of,
    mlx_lm_version,
    tokenizers_backend_of,
)

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


@pytest.fixture(scope="module")
def owners(tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    """A real object for every owner in PRIVATE_NAMES, keyed as the list names it."""
    model, tokenizer = load(str(tiny_model_dir))[:2]
    forward = inspect.signature(type(model).__call__).parameters
    yield {
        "mlx_lm.models.cache.BatchKVCache": BatchKVCache([0]),
        "mlx_lm.tokenizer_utils.TokenizerWrapper": tokenizer,
        "transformers.PreTrainedTokenizerFast": PreTrainedTokenizerFast,
        "mlx_lm.models.base": importlib.import_module("mlx_lm.models.base"),
        "mlx_lm.models.<model type>": importlib.import_module(type(model).__module__),
        "mlx_lm.models.<model type>.Model.__call__": {n: i for i, n in enumerate(forward)},
        "mlx_lm.utils.load_model": inspect.signature(load_model).parameters,
    }


def _present(owner: Any, name: str) -> bool:
    return name in owner if isinstance(owner, Mapping) else hasattr(owner, name)


@pytest.mark.parametrize("private", PRIVATE_NAMES, ids=lambda p: f"{p.owner}.{p.name}")
def test_each_private_name_the_runtime_uses_exists(
    owners: dict[str, Any], private: PrivateName
) -> None:
    assert private.owner in owners, f"no test object for {private.owner}: add one to `owners`"
    owner = owners[private.owner]
    assert owner is not None and _present(owner, private.name), (
        f"mlx-lm {mlx_lm_version()}: {private.owner} has no `{private.name}` any more "
        f"({private.use}). Adapt mlxlaunch/engine/runtime/mlx_lm_internals.py to this version."
    )


def test_model_modules_call_the_attention_they_imported_by_name(owners: dict[str, Any]) -> None:
    module = owners["mlx_lm.models.<model type>"]
    bound = bound_attention(module)
    original = getattr(bound, "mlxlaunch_original", bound)  # an engine may have installed ours
    assert original is not None and original is base_attention(), (
        f"mlx-lm {mlx_lm_version()}: {module.__name__} no longer binds mlx-lm's "
        "scaled_dot_product_attention by name: the CPU attention would never be called"
    )


def test_a_models_forward_pass_takes_its_cache_second(owners: dict[str, Any]) -> None:
    forward = owners["mlx_lm.models.<model type>.Model.__call__"]
    assert forward.get("cache") == 2, (  # self, inputs, cache
        f"mlx-lm {mlx_lm_version()}: Model.__call__ is {list(forward)}; "
        "forward_cache reads the cache as the argument after the inputs"
    )


def test_the_tokenizer_behind_the_wrapper_is_the_hugging_face_one(
    owners: dict[str, Any],
) -> None:
    wrapper = owners["mlx_lm.tokenizer_utils.TokenizerWrapper"]
    assert isinstance(hf_tokenizer_of(wrapper), PreTrainedTokenizerFast)
    assert tokenizers_backend_of(wrapper) is not None  # the test model's is a plain fast one


def test_a_batch_cache_holding_buffers_writes_after_them() -> None:
    keys = mx.zeros((1, 2, 8, 4))
    batch = batch_cache_holding(keys, mx.zeros((1, 2, 8, 4)), 5)
    new = mx.ones((1, 2, 1, 4))
    got, _ = batch.update_and_fetch(new, new)
    assert got.shape[2] == 6  # five held positions, then the new one
    assert batch.keys is keys  # written into the room after them, not copied into a new buffer
    assert mx.array_equal(got[:, :, 5], new[:, :, 0]).item()
    assert batch.offset.tolist() == [6]
