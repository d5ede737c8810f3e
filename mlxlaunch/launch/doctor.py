"""`mlx doctor`: facts about this machine, judged into checks that each carry a fix.

`gather_facts()` reads the real machine; `run_checks(facts)` is pure, so tests inject facts
(no claude, little memory, no models) and read the verdicts.
"""

from __future__ import annotations

import platform
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mlxlaunch.launch.claude_bin import INSTALL_HINT, claude_version, find_claude
from mlxlaunch.launch.state import RunState, running_servers
from mlxlaunch.store.catalog import recommend
from mlxlaunch.store.memory import GIB, format_bytes, memory_fit, system_memory_bytes

Status = Literal["ok", "warn", "fail", "info"]

LOW_MEMORY = 16 * GIB  # below this only small models fit alongside the OS and an editor
DISK_HEADROOM = 2 * GIB


@dataclass(frozen=True)
class ModelFact:
    """One local model as the doctor sees it."""

    name: str
    weights_bytes: int
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the checks look at; gathered from the machine or given by a test."""

    system: str  # platform.system(): "Darwin", "Linux", …
    machine: str  # platform.machine(): "arm64", "x86_64", …
    mlx_version: str | None  # None: mlx does not import
    device: str | None  # "gpu" or "cpu"
    backend_error: str | None
    total_memory: int
    claude_path: str | None
    claude_version: str | None
    models: tuple[ModelFact, ...]
    models_dir: str
    free_disk: int
    servers: tuple[RunState, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, what was found, and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


def _backend_check(f: DoctorFacts) -> Check:
    if f.mlx_version is None:
        on_linux = f.system == "Linux"
        return Check(
            "MLX backend",
            "fail",
            f"mlx does not load: {f.backend_error or 'unknown'}",
            'pip install "mlx[cpu]"  (or mlx[cuda] with an NVIDIA GPU)'
            if on_linux
            else "pip install --force-reinstall mlx",
        )
    where = f"mlx {f.mlx_version} on {f.device or '?'}"
    if f.device == "gpu":
        return Check("MLX backend", "ok", where)
    if f.system == "Darwin" and f.machine == "arm64":
        return Check(
            "MLX backend",
            "warn",
            where + " (Metal GPU not in use)",
            "check that Python is a native arm64 build, not running under Rosetta",
        )
    return Check(
        "MLX backend",
        "warn",
        where + ": generation will be slow",
        'on Linux with an NVIDIA GPU: pip install "mlx[cuda]"' if f.system == "Linux" else None,
    )


def _memory_check(f: DoctorFacts) -> Check:
    if f.total_memory <= 0:
        return Check("memory", "warn", "unknown", "models are judged without a memory limit")
    best = recommend(f.total_memory)
    detail = f"{format_bytes(f.total_memory)} total"
    if best is None:
        return Check(
            "memory",
            "fail",
            detail + ": no catalog model fits",
            "use a machine with more memory, or a small local model via --model PATH",
        )
    if f.total_memory < LOW_MEMORY:
        return Check(
            "memory",
            "warn",
            f"{detail}: only small models fit (best: {best.alias})",
            "close other apps; 16 GB or more gives a much better experience",
        )
    return Check("memory", "ok", f"{detail}; recommended model: {best.alias}")


def _claude_check(f: DoctorFacts) -> Check:
    if f.claude_path is None:
        return Check("claude", "fail", "Claude Code is not on PATH", INSTALL_HINT)
    if f.claude_version is None:
        return Check(
            "claude",
            "warn",
            f"{f.claude_path} does not answer --version",
            "reinstall: npm install -g @anthropic-ai/claude-code",
        )
    return Check("claude", "ok", f"{f.claude_version} at {f.claude_path}")


def _model_checks(f: DoctorFacts) -> list[Check]:
    best = recommend(f.total_memory) if f.total_memory > 0 else None
    pull = f"mlx models pull {best.alias}" if best else "mlx models catalog"
    if not f.models:
        return [Check("models", "warn", "no models downloaded", pull)]
    checks = []
    for model in f.models:
        name = f"model {model.name}"
        if model.problems:
            checks.append(
                Check(
                    name,
                    "fail",
                    "; ".join(model.problems),
                    f"mlx models rm {model.name}, then {pull}",
                )
            )
            continue
        fit = memory_fit(model.weights_bytes, f.total_memory)
        if fit.fits:
            checks.append(Check(name, "ok", fit.describe()))
        else:
            checks.append(Check(name, "warn", fit.describe(), f"pick a smaller model: {pull}"))
    return checks


def _disk_check(f: DoctorFacts) -> Check:
    best = recommend(f.total_memory) if f.total_memory > 0 else None
    needed = (best.size_bytes if best else 0) + DISK_HEADROOM
    detail = f"{format_bytes(f.free_disk)} free at {f.models_dir}"
    if f.free_disk < needed:
        what = f"{best.alias} needs {format_bytes(best.size_bytes)}" if best else "low space"
        return Check(
            "disk", "warn", f"{detail} ({what})", "free space, or set HF_HUB_CACHE to a bigger disk"
        )
    return Check("disk", "ok", detail)


def _server_check(f: DoctorFacts) -> Check:
    if not f.servers:
        return Check("server", "info", "none running", "start one: mlx launch claude")
    lines = [f"{s.url} ({s.kind}, {s.model}, pid {s.pid})" for s in f.servers]
    return Check("server", "ok", "; ".join(lines))


def run_checks(facts: DoctorFacts) -> list[Check]:
    """All checks in report order."""
    return [
        _backend_check(facts),
        _memory_check(facts),
        _claude_check(facts),
        *_model_checks(facts),
        _disk_check(facts),
        _server_check(facts),
    ]


def worst(checks: list[Check]) -> Status:
    """The most serious status among `checks` (decides the exit code)."""
    statuses = {c.status for c in checks}
    if "fail" in statuses:
        return "fail"
    return "warn" if "warn" in statuses else "ok"


def _mlx_facts() -> tuple[str | None, str | None, str | None]:
    try:
        import mlx.core as mx
    except Exception as exc:  # a broken install raises ImportError or OSError
        return None, None, str(exc)
    return str(getattr(mx, "__version__", "?")), str(mx.default_device().type.name), None


def _free_disk(directory: Path) -> int:
    # The cache may not exist yet: measure the nearest existing parent.
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def _local_models() -> tuple[ModelFact, ...]:
    from mlxlaunch.store.inventory import list_models

    return tuple(
        ModelFact(m.name, m.facts.weights_bytes, tuple(m.facts.problems())) for m in list_models()
    )


def gather_facts(
    *,
    claude_bin: str | None = None,
    models: Callable[[], tuple[ModelFact, ...]] = _local_models,
) -> DoctorFacts:
    """Read the facts of this machine (mlx, memory, claude, models, disk, servers)."""
    from mlxlaunch.errors import ClaudeNotFound
    from mlxlaunch.store.paths import hub_cache_dir

    version, device, error = _mlx_facts()
    try:
        claude: Path | None = find_claude(claude_bin)
    except ClaudeNotFound:
        claude = None
    cache = hub_cache_dir()
    return DoctorFacts(
        system=platform.system(),
        machine=platform.machine(),
        mlx_version=version,
        device=device,
        backend_error=error,
        total_memory=system_memory_bytes(),
        claude_path=str(claude) if claude else None,
        claude_version=claude_version(claude) if claude else None,
        models=models(),
        models_dir=str(cache),
        free_disk=_free_disk(cache),
        servers=tuple(running_servers()),
    )
