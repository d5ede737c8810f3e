"""Which tests are model-backed, so conftest.py can hold them to the `slow` marker.

A test is model-backed when it builds, loads or serves a model: it asks (through any chain of
fixtures) for one of `MODEL_FIXTURES`, or its code — the test, the fixtures it asks for, and
the test-suite functions they call, followed by name — uses one of `MODEL_BUILDERS`. Marking
them `slow` (pyproject.toml) is what lets `pytest -m "not slow"` run in seconds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent

# Session fixtures of conftest.py that build the test models.
MODEL_FIXTURES = frozenset({"tiny_model_dir", "small_model_dir"})
# The other ways a test gets a model: build one, or start `mlx` serving one in a process.
# tests/test_markers.py checks that each still exists, so a rename cannot hide a slow test.
MODEL_BUILDERS = frozenset(
    {"ensure_test_model", "build_model", "_start_serve", "scripted_mlx_command"}
)


def model_backed(
    function: Callable[..., Any] | None,
    fixture_names: Iterable[str],
    scope: Mapping[str, Any],
) -> bool:
    """Whether a test builds, loads or serves a model.

    Args:
        function: the test function.
        fixture_names: every fixture the test uses, directly or through other fixtures.
        scope: the test module's globals, where its fixtures and helpers are found by name.
    """
    names = set(fixture_names)
    if names & MODEL_FIXTURES:
        return True
    todo: list[Any] = [function, *(scope.get(name) for name in names)]
    seen: set[CodeType] = set()
    while todo:
        target = _own_function(todo.pop())
        if target is None or target.__code__ in seen:
            continue
        seen.add(target.__code__)
        for code in _nested(target.__code__):
            if MODEL_BUILDERS & set(code.co_names):
                return True
            todo += [target.__globals__.get(name) for name in code.co_names]
    return False


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
