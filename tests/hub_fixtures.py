"""Fixtures for tests that talk to the hub: an empty cache and a local hub serving test repos.

Registered for every test module by `pytest_plugins` in conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehub import FakeHub, serve_test_repos


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache and mlxlaunch home. (A session fixture such as `tiny_model_dir` is
    set up before this one, so test models still build in the shared home.)"""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


@pytest.fixture
def hub(
    hub_cache: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeHub]:
    """A local hub serving the test repos, with HF_ENDPOINT pointing at it."""
    with FakeHub() as server:
        serve_test_repos(server, tiny_model_dir)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server
