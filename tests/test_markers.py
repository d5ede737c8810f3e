"""Every costly test says its tier (conftest.py enforces it with tests/tiers.py): the rule finds
model-backed and process-starting tests, refuses a test in two tiers, and every name it looks
for still exists; the Makefile's tiers are the ones the rule describes."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import conftest
import pytest
import scripted_mlx
import test_serve_cli
from tiers import (
    MODEL_BUILDERS,
    MODEL_FIXTURES,
    QUICK,
    QUICK_TIER,
    SLOW,
    model_backed,
    module_is_slow,
    starts_processes,
    tier_problem,
)

import mlxlaunch.testing
import mlxlaunch.testing.builder

ROOT = Path(__file__).resolve().parent.parent


def test_every_name_the_rule_looks_for_exists() -> None:
    # A renamed builder or fixture would silently let its tests run unmarked.
    homes: list[Any] = [mlxlaunch.testing, mlxlaunch.testing.builder, test_serve_cli, scripted_mlx]
    missing = [name for name in MODEL_BUILDERS if not any(hasattr(h, name) for h in homes)]
    assert not missing
    assert all(hasattr(conftest, name) for name in MODEL_FIXTURES)


def test_both_tier_markers_are_declared() -> None:
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = pytest_options["ini_options"]["markers"]
    assert any(m.startswith(f"{SLOW}:") and "model" in m for m in markers), markers
    assert any(m.startswith(f"{QUICK}:") and "make test" in m for m in markers), markers


def test_the_makefile_runs_the_quick_tier_and_everything() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([\w-]+): [^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M))
    assert f'-m "{QUICK_TIER}"' in recipes["test"]
    assert "make test-all" in recipes["test"]  # it says how to run the rest
    everything = recipes["test-all"]
    assert "pytest" in everything.lower() and '-m "' not in everything  # no tier left out


def _helper_that_serves() -> None:
    test_serve_cli._start_serve("tiny", {})


def _test_through_a_helper() -> None:
    _helper_that_serves()


def _test_that_builds() -> None:
    mlxlaunch.testing.builder.build_model(Path("x"), "tiny")


def _test_without_a_model() -> None:
    assert [n for n in range(3) if n]


def _test_that_runs_a_command() -> None:
    subprocess.run(["true"], check=True)


def _helper_that_starts_a_child() -> Any:
    return asyncio.create_subprocess_exec("true")


def _test_through_a_starting_helper() -> None:
    asyncio.run(_helper_that_starts_a_child())


def _test_that_forks() -> None:
    if os.fork() == 0:
        os._exit(0)


def _test_that_only_names_subprocess_errors() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        raise subprocess.TimeoutExpired("x", 1)


@pytest.fixture
def _built_here() -> None:
    mlxlaunch.testing.ensure_test_model("tiny")


@pytest.fixture
def _started_here() -> None:
    subprocess.Popen(["true"]).wait()


# Looked up by string: were this test to name them, the rule would find it costly too.
SAMPLES = {name: f for name, f in globals().items() if name.startswith("_test_")}


def test_the_rule_finds_model_backed_tests_and_only_those() -> None:
    scope = globals()
    plain = SAMPLES["_test_without_a_model"]
    assert model_backed(plain, ["tmp_path", "tiny_model_dir"], scope)
    assert model_backed(SAMPLES["_test_that_builds"], [], scope)
    assert model_backed(SAMPLES["_test_through_a_helper"], [], scope)  # through a helper
    assert model_backed(plain, ["_built_here"], scope)  # a fixture of the module
    assert not model_backed(plain, ["tmp_path", "monkeypatch"], scope)
    assert not model_backed(SAMPLES["_test_that_runs_a_command"], [], scope)
    assert not model_backed(test_both_tier_markers_are_declared, [], scope)


def test_the_rule_finds_process_starting_tests_and_only_those() -> None:
    scope = globals()
    plain = SAMPLES["_test_without_a_model"]
    assert starts_processes(SAMPLES["_test_that_runs_a_command"], [], scope)
    assert starts_processes(SAMPLES["_test_through_a_starting_helper"], [], scope)
    assert starts_processes(SAMPLES["_test_that_forks"], [], scope)
    assert starts_processes(plain, ["_started_here"], scope)  # a fixture of the module
    assert not starts_processes(plain, ["tmp_path"], scope)
    assert not starts_processes(SAMPLES["_test_that_only_names_subprocess_errors"], [], scope)


def test_a_costly_test_needs_exactly_one_tier() -> None:
    scope = globals()
    builds, runs = SAMPLES["_test_that_builds"], SAMPLES["_test_that_runs_a_command"]
    plain = SAMPLES["_test_without_a_model"]
    assert "model" in (tier_problem(builds, ["parametrize"], [], scope) or "")
    assert "process" in (tier_problem(runs, [], [], scope) or "")
    assert tier_problem(builds, [SLOW], [], scope) is None
    assert tier_problem(runs, [QUICK, "e2e"], [], scope) is None
    assert tier_problem(plain, [], ["tmp_path"], scope) is None  # a unit test: quick unmarked
    assert "one tier" in (tier_problem(plain, [SLOW, QUICK], [], scope) or "")


@pytest.mark.parametrize(
    "case",
    [pytest.param("p", marks=pytest.mark.quick), pytest.param("s", marks=pytest.mark.slow)],
)
def test_a_parameter_can_carry_the_tier(request: pytest.FixtureRequest, case: str) -> None:
    # What conftest.py hands the rule: the markers of the test, its parameters and module.
    markers = [marker.name for marker in request.node.iter_markers()]
    assert (QUICK if case == "p" else SLOW) in markers
    assert tier_problem(SAMPLES["_test_that_runs_a_command"], markers, [], globals()) is None


def test_the_quick_tier_leaves_out_only_modules_whose_tests_are_all_slow() -> None:
    assert module_is_slow("import pytest\n\npytestmark = pytest.mark.slow  # models\n")
    assert module_is_slow("pytestmark = [pytest.mark.e2e, pytest.mark.slow]\n")
    assert not module_is_slow("pytestmark = pytest.mark.e2e\n")
    assert not module_is_slow("@pytest.mark.slow\ndef test_x() -> None:\n    pass\n")
    assert not module_is_slow("pytestmark = [pytest.mark.skipif(True, reason='slow')]\n")
    assert not module_is_slow("def f() -> None:\n    pytestmark = pytest.mark.slow\n")
    slow_here = [
        p.name for p in Path(__file__).parent.rglob("test_*.py") if module_is_slow(p.read_text())
    ]
    assert "test_serve_cli.py" not in slow_here and "test_markers.py" not in slow_here
    assert "test_scheduler.py" in slow_here  # `pytestmark = pytest.mark.slow  # ...`


def test_under_xdist_a_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    conftest.pytest_collection_modifyitems(request.config, [request.node])
    assert [m.args[0] for m in request.node.iter_markers("xdist_group")] == ["test_markers"]


@pytest.mark.xdist_group("shared-port")
def test_under_xdist_a_group_of_its_own_is_kept(request: pytest.FixtureRequest) -> None:
    conftest.pytest_collection_modifyitems(request.config, [request.node])
    assert [m.args[0] for m in request.node.iter_markers("xdist_group")] == ["shared-port"]
