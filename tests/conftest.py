"""Session-wide test setup: a persistent model cache and the built test models.

Keep this file small and general; rooms add their own fixtures in their own test modules.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis_profiles import load_profile
from tiers import QUICK_TIER, module_is_slow, tier_problem

from mlxlaunch.blas import use_optimised_blas

pytest_plugins = ["hub_fixtures", "served_fixtures", "search_fakes", "e2e.launching"]

# First, before any test imports mlx: libmlx binds its matmul to the first BLAS loaded, so the
# suite runs on an installed OpenBLAS like `mlx` does, and on the reference BLAS without one.
BLAS = use_optimised_blas()

# The pytest-xdist group of the end-to-end tests (see pytest_collection_modifyitems).
AGENTS_GROUP = "agents"

# Before the test modules are imported: their `examples()` counts read the loaded profile.
HYPOTHESIS_PROFILE = load_profile()

# A suite started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# ignored, and so would every `mlx serve` a test starts, deaf to the Ctrl-C the test sends.
# A handler here is reset to the default in children at exec, where Python installs its own.
# pytest-xdist's workers run with COLUMNS=80 and LINES=24 (set for their own output); the CLI
# honours COLUMNS, so under xdist it would wrap what a plain run prints unwrapped. Tests that
# want a width set COLUMNS themselves (monkeypatch).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Every test that builds, loads or serves a model, or starts a process, says its tier
    (`slow` or `quick`, tests/tiers.py), so `make test` stays quick on purpose; one without it
    fails here, before its fixtures build anything."""
    if not isinstance(item, pytest.Function):
        return
    markers = [marker.name for marker in item.iter_markers()]
    problem = tier_problem(item.function, markers, item.fixturenames, vars(item.module))
    if problem is not None:
        pytest.fail(
            f"{item.nodeid} {problem}: mark it @pytest.mark.slow (the full tier, "
            "`make test-all`) or, if it takes well under a second, @pytest.mark.quick "
            "(a module whose tests all are: pytestmark = pytest.mark.slow); see tests/tiers.py",
            pytrace=False,
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick tier (`-m "not slow"`) leaves out modules whose tests are all slow without
    importing them: they would all be deselected, after seconds of imports."""
    if config.option.markexpr.strip() != QUICK_TIER or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return True if module_is_slow(collection_path.read_text(encoding="utf-8")) else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's `--dist loadgroup` (`make test`, `make test-all`) each module's
    tests run on one worker, so its module-scoped fixtures (a served engine, a model per
    template family) are set up once, not on both workers and again whenever the order
    switches between their parameters. The end-to-end tests share one worker across modules:
    they share the agents' npm installs (tests/e2e/claude_cli.py); a test that carries an
    `xdist_group` of its own keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        e2e = item.get_closest_marker("e2e") is not None
        item.add_marker(pytest.mark.xdist_group(AGENTS_GROUP if e2e else item.path.stem))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Recreate pytest-textual-snapshot's scratch directory if it went missing.

    The plugin keeps its diffs in a `mkdtemp` directory under /tmp for the whole session and
    lists it at the end; in one 18-minute clean-clone run that directory was gone by then
    (deleted by something outside this suite: every test had passed), and the plugin's
    traceback turned a green run red. Its contents only matter when a snapshot failed, which
    fails that test on its own.
    """
    scratch = os.environ.get("TEXTUAL_SNAPSHOT_TEMPDIR")
    if scratch and not os.path.isdir(scratch):
        os.makedirs(scratch, exist_ok=True)


def pytest_report_header() -> str:
    """Which BLAS this run's MLX multiplies with (CI's log shows a fresh machine's run)."""
    if BLAS.outcome == "loaded":
        return f"BLAS: {BLAS.path}"
    return f"BLAS: the mlx wheel's own ({BLAS.outcome})"


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


@pytest.fixture(scope="session")
def medium_model_dir() -> Path:
    """A 2-layer, hidden-128 model: a decode step is milliseconds, a prefill of 8k tokens
    seconds (the pacing and fairness tests)."""
    from mlxlaunch.testing import ensure_test_model

    return ensure_test_model("medium")


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


@pytest.fixture
def medium_engine(
    medium_model_dir: Path, scripted: ScriptedOutput
) -> Iterator[tuple[Engine, ScriptedOutput]]:
    """A started engine on the medium model, and the script of its output."""
    from mlxlaunch.engine.config import EngineConfig
    from mlxlaunch.engine.engine import Engine

    engine = Engine(EngineConfig(model=str(medium_model_dir), logits_hook=scripted))
    engine.start()
    yield engine, scripted
    engine.close()


# Signals whose handling a test must leave as it found it: child processes inherit an ignored
# signal, so one test's leftover SIG_IGN makes a later `mlx serve` deaf to Ctrl-C.
_GUARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGTTOU", "SIGTSTP", "SIGCONT")


@pytest.fixture(autouse=True)
def _signal_handlers_are_restored() -> Iterator[None]:
    guarded = [getattr(signal, name) for name in _GUARDED_SIGNALS]
    before = {sig: signal.getsignal(sig) for sig in guarded}
    yield
    changed = {
        sig.name: (before[sig], now)
        for sig in guarded
        if (now := signal.getsignal(sig)) is not before[sig]
    }
    for sig in guarded:
        signal.signal(sig, before[sig])  # restored either way, so one leak fails one test
    assert not changed, f"signal handlers left changed: {changed}"


# Set by others, not by tests: pytest for each phase of each test, threadpoolctl when it is
# first imported (the CPU attention imports it lazily), mlx_lm when it is first imported (the
# CLI imports a command's code when that command runs).
_NOT_LEAKS = {"PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "TRANSFORMERS_NO_ADVISORY_WARNINGS"}


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NOT_LEAKS}


@pytest.fixture(autouse=True)
def _environment_is_restored() -> Iterator[None]:
    # Child processes (`mlx serve`, `mlx launch`) inherit os.environ: a variable one test left
    # behind changes what every later test's children do. Use monkeypatch.setenv instead.
    before = _environment()
    yield
    after = _environment()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in changed:  # put back either way, so one leak fails one test
        if key in before:
            os.environ[key] = before[key]
        else:
            os.environ.pop(key, None)
    assert not changed, f"environment variables left changed: {changed}"
