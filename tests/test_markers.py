"""Model-backed tests carry the `slow` marker (conftest.py enforces it with tests/model_backed.py):
the rule finds them, and every name it looks for still exists."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import conftest
import pytest
import scripted_mlx
import test_serve_cli
from model_backed import MODEL_BUILDERS, MODEL_FIXTURES, model_backed

import mlxlaunch.testing
import mlxlaunch.testing.builder

ROOT = Path(__file__).resolve().parent.parent


def test_every_name_the_rule_looks_for_exists() -> None:
    # A renamed builder or fixture would silently let its tests run unmarked.
    homes: list[Any] = [mlxlaunch.testing, mlxlaunch.testing.builder, test_serve_cli, scripted_mlx]
    missing = [name for name in MODEL_BUILDERS if not any(hasattr(h, name) for h in homes)]
    assert not missing
    assert all(hasattr(conftest, name) for name in MODEL_FIXTURES)


def test_the_slow_marker_is_declared() -> None:
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = pytest_options["ini_options"]["markers"]
    assert any(m.startswith("slow:") and "model" in m for m in markers), markers


def _helper_that_serves() -> None:
    test_serve_cli._start_serve("tiny", {})


def _test_through_a_helper() -> None:
    _helper_that_serves()


def _test_that_builds() -> None:
    mlxlaunch.testing.builder.build_model(Path("x"), "tiny")


def _test_without_a_model() -> None:
    assert [n for n in range(3) if n]


@pytest.fixture
def _built_here() -> None:
    mlxlaunch.testing.ensure_test_model("tiny")


# Looked up by string: were this test to name them, the rule would find it model-backed too.
SAMPLES = {name: f for name, f in globals().items() if name.startswith("_test_")}


def test_the_rule_finds_model_backed_tests_and_only_those() -> None:
    scope = globals()
    plain = SAMPLES["_test_without_a_model"]
    assert model_backed(plain, ["tmp_path", "tiny_model_dir"], scope)
    assert model_backed(SAMPLES["_test_that_builds"], [], scope)
    assert model_backed(SAMPLES["_test_through_a_helper"], [], scope)  # through a helper
    assert model_backed(plain, ["_built_here"], scope)  # a fixture of the module
    assert not model_backed(plain, ["tmp_path", "monkeypatch"], scope)
    assert not model_backed(test_the_slow_marker_is_declared, [], scope)
