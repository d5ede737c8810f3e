"""The two test tiers, and the rule that puts every costly test in one of them on purpose.

`make test` runs the quick tier (`pytest -m "not slow"`): unit tests, plus the few tests marked
`quick` that go through the real path once (a real `mlx serve`, a real Claude Code round trip).
`make test-all` and a plain `pytest` run everything, the `slow` tier included.

A test that builds, loads or serves a model, or that starts a process, costs seconds: it must
say which tier it is in, `@pytest.mark.slow` or `@pytest.mark.quick` (conftest.py fails it
otherwise, before its fixtures build anything). A test is model-backed when it asks (through any
chain of fixtures) for one of `MODEL_FIXTURES`, or its code — the test, the fixtures it asks
for, and the test-suite functions they call, followed by name — uses one of `MODEL_BUILDERS`; it
starts a process when that same code calls one of `PROCESS_STARTERS`.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent

# The tier markers (pyproject.toml declares them); a test carries at most one.
SLOW = "slow"
QUICK = "quick"
TIERS = (SLOW, QUICK)
# The quick tier as a marker expression (the Makefile's `make test`).
QUICK_TIER = f"not {SLOW}"

# Session fixtures of conftest.py that build the test models.
MODEL_FIXTURES = frozenset({"tiny_model_dir", "small_model_dir", "medium_model_dir"})
# The other ways a test gets a model: build one, or start `mlx` serving one in a process.
# tests/test_markers.py checks that each still exists, so a rename cannot hide a slow test.
MODEL_BUILDERS = frozenset(
    {"ensure_test_model", "build_model", "_start_serve", "scripted_mlx_command"}
)
# Module → the functions of it that start a child process, as code names them
# (`subprocess.run(...)` names both `subprocess` and `run`).
PROCESS_STARTERS: dict[str, frozenset[str]] = {
    "subprocess": frozenset(
        {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
    ),
    "asyncio": frozenset({"create_subprocess_exec", "create_subprocess_shell"}),
    "os": frozenset({"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen"}),
    "pty": frozenset({"fork", "spawn"}),
}


def tier_problem(
    function: Callable[..., Any] | None,
    markers: Iterable[str],
    fixture_names: Iterable[str],
    scope: Mapping[str, Any],
) -> str | None:
    """Why a test's tier is wrong (two tier markers, or none on a costly test), else None.

    Args:
        function: the test function.
        markers: the names of the markers the test carries (its own, its class's, its module's).
        fixture_names: every fixture the test uses, directly or through other fixtures.
        scope: the test module's globals, where its fixtures and helpers are found by name.
    """
    tiers = [name for name in TIERS if name in set(markers)]
    if len(tiers) > 1:
        return "is marked both slow and quick: a test is in one tier"
    if tiers:
        return None
    if model_backed(function, fixture_names, scope):
        return "builds, loads or serves a model"
    if starts_processes(function, fixture_names, scope):
        return "starts a process"
    return None


def model_backed(
    function: Callable[..., Any] | None,
    fixture_names: Iterable[str],
    scope: Mapping[str, Any],
) -> bool:
    """Whether a test builds, loads or serves a model (arguments as for `tier_problem`)."""
    names = set(fixture_names)
    if names & MODEL_FIXTURES:
        return True
    return any(
        MODEL_BUILDERS & set(code.co_names) for code in _reachable_code(function, scope, names)
    )


def starts_processes(
    function: Callable[..., Any] | None,
    fixture_names: Iterable[str],
    scope: Mapping[str, Any],
) -> bool:
    """Whether a test's own code (or its fixtures' and helpers') starts a child process."""
    for code in _reachable_code(function, scope, set(fixture_names)):
        names = set(code.co_names)
        if any(module in names and calls & names for module, calls in PROCESS_STARTERS.items()):
            return True
    return False


def _reachable_code(
    function: Callable[..., Any] | None, scope: Mapping[str, Any], fixture_names: set[str]
) -> Iterable[CodeType]:
    """The code of the test, of its fixtures and of the test-suite functions they name."""
    todo: list[Any] = [function, *(scope.get(name) for name in fixture_names)]
    seen: set[CodeType] = set()
    while todo:
        target = _own_function(todo.pop())
        if target is None or target.__code__ in seen:
            continue
        seen.add(target.__code__)
        for code in _nested(target.__code__):
            yield code
            todo += [target.__globals__.get(name) for name in code.co_names]


def _own_function(obj: Any) -> Any:
    """`obj` as a plain function defined in the test suite (a fixture unwrapped), else None."""
    if not callable(obj):
        return None
    function = inspect.unwrap(obj)
    code = getattr(function, "__code__", None)
    if code is None or not Path(code.co_filename).resolve().is_relative_to(TESTS_DIR):
        return None
    return function


def _nested(code: CodeType) -> Iterable[CodeType]:
    """`code` and the code of the functions, lambdas and comprehensions defined inside it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _nested(constant)


def module_is_slow(source: str) -> bool:
    """Whether a test module marks all its tests slow (`pytestmark = pytest.mark.slow`, or a
    list holding it): the quick tier then need not import it at all."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            marks = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return any(ast.unparse(mark) == f"pytest.mark.{SLOW}" for mark in marks)
    return False
