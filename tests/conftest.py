"""Session-wide test setup: a persistent model cache and the built test models.

Keep this file small and general; rooms add their own fixtures in their own test modules.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from mlxlaunch.engine.engine import Engine
    from mlxlaunch.testing.scripted import ScriptedOutput

# Test models build once per machine and are reused between runs (they are keyed by a hash of
# the builder, so a change to it rebuilds them). Set before any mlxlaunch import reads it.
os.environ.setdefault("MLXLAUNCH_HOME", str(Path.home() / ".cache" / "mlxlaunch-tests"))

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures" / "claude-code-2.1.332"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Requests captured from Claude Code 2.1.332 (see its README.md)."""
    return FIXTURES_DIR


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A 1-layer, hidden-64 qwen3 model with random weights, loadable by ``mlx_lm.load``."""
    from mlxlaunch.testing import ensure_test_model

    return ensure_test_model("tiny")


@pytest.fixture(scope="session")
def small_model_dir() -> Path:
    """A 1-layer, hidden-256 qwen3 model: prefills Claude Code's prompt in seconds."""
    from mlxlaunch.testing import ensure_test_model

    return ensure_test_model("small")


@pytest.fixture
def scripted() -> ScriptedOutput:
    """A logits hook that makes the tiny model say what a test scripts (nothing by default)."""
    from mlxlaunch.testing.scripted import ScriptedOutput

    return ScriptedOutput()


@pytest.fixture
def engine(tiny_model_dir: Path, scripted: ScriptedOutput) -> Iterator[Engine]:
    """An engine on the tiny model, its output scripted by the `scripted` fixture."""
    from mlxlaunch.engine.config import EngineConfig
    from mlxlaunch.engine.engine import Engine

    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=scripted))
    yield engine
    engine.close()
