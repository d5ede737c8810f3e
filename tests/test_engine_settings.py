"""engine/settings.py: the context window a model is served with follows the store's one rule."""

from __future__ import annotations

from typing import Any

import pytest

from mlxlaunch.engine.settings import FALLBACK_CONTEXT_WINDOW, context_window_of
from mlxlaunch.store.facts import CONTEXT_KEYS, context_window


@pytest.mark.parametrize("key", CONTEXT_KEYS)
def test_the_engine_serves_the_window_the_store_reads(key: str) -> None:
    for config in ({key: 32768}, {"text_config": {key: 32768}}):
        assert context_window(config) == 32768
        assert context_window_of(config) == 32768


@pytest.mark.parametrize(
    "config",
    [
        {"max_position_embeddings": 40960, "n_ctx": 2048},  # the first key in the order wins
        {"seq_length": 40960, "text_config": {"max_position_embeddings": 2048}},  # top level
    ],
)
def test_both_read_keys_in_the_same_order(config: dict[str, Any]) -> None:
    assert context_window(config) == context_window_of(config) == 40960


def test_an_override_wins_and_a_config_without_a_window_falls_back() -> None:
    assert context_window_of({"max_position_embeddings": 40960}, 16384) == 16384
    assert context_window({"hidden_size": 64}) is None
    assert context_window_of({"hidden_size": 64}) == FALLBACK_CONTEXT_WINDOW
    assert context_window_of({"max_position_embeddings": 0}) == FALLBACK_CONTEXT_WINDOW
