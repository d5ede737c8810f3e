"""`mlx doctor` verdicts and its table, from injected facts."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from run_records import run_record

from mlxlaunch.cli.doctor import checks_table
from mlxlaunch.launch.doctor import Check, DoctorFacts, ModelFact, gather_facts, run_checks, worst
from mlxlaunch.store.catalog import recommend
from mlxlaunch.store.compute import Compute
from mlxlaunch.store.memory import GIB

HEALTHY = DoctorFacts(
    system="Darwin",
    machine="arm64",
    mlx_version="0.32.4",
    device="gpu",
    backend_error=None,
    total_memory=64 * GIB,
    claude_path="/usr/local/bin/claude",
    claude_version="2.1.332 (Claude Code)",
    models=(ModelFact("qwen3-8b", 5 * GIB),),
    models_dir="/hub",
    free_disk=500 * GIB,
)


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def _render(checks: list[Check]) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(checks_table(checks))
    return console.export_text()


def test_healthy_machine_is_all_ok() -> None:
    checks = run_checks(HEALTHY)
    assert worst(checks) == "ok"
    assert _by_name(checks)["model qwen3-8b"].status == "ok"
    assert _by_name(checks)["server"].status == "info"


def test_no_claude_fails_with_the_install_command() -> None:
    checks = run_checks(replace(HEALTHY, claude_path=None, claude_version=None))
    claude = _by_name(checks)["claude"]
    assert claude.status == "fail" and worst(checks) == "fail"
    assert claude.fix is not None and "mlx launch claude --install-claude" in claude.fix
    assert "@anthropic-ai/claude-code@2.1.332" in " ".join(_render(checks).split())


def test_low_memory_warns_and_big_models_do_not_fit() -> None:
    facts = replace(
        HEALTHY,
        total_memory=8 * GIB,
        models=(ModelFact("qwen3-30b", 17 * GIB), ModelFact("qwen3-4b", 2 * GIB)),
    )
    checks = _by_name(run_checks(facts))
    assert checks["memory"].status == "warn"
    small = recommend(8 * GIB)
    assert small is not None and small.alias in checks["memory"].detail
    assert checks["model qwen3-30b"].status == "warn"
    assert "does NOT fit" in checks["model qwen3-30b"].detail
    assert checks["model qwen3-30b"].fix == f"pick a smaller model: mlx models pull {small.alias}"
    assert checks["model qwen3-4b"].status == "ok"


def test_memory_too_small_for_any_model_fails() -> None:
    checks = _by_name(run_checks(replace(HEALTHY, total_memory=1 * GIB)))
    assert checks["memory"].status == "fail"


def test_no_models_suggests_the_recommended_pull() -> None:
    checks = _by_name(run_checks(replace(HEALTHY, models=())))
    best = recommend(64 * GIB)
    assert best is not None
    assert checks["models"].status == "warn"
    assert checks["models"].fix == f"mlx models pull {best.alias}"


def test_broken_model_and_cpu_backend_and_small_disk() -> None:
    facts = replace(
        HEALTHY,
        system="Linux",
        machine="x86_64",
        device="cpu",
        free_disk=GIB,
        models=(ModelFact("odd", GIB, ("no tokenizer files",)),),
    )
    checks = _by_name(run_checks(facts))
    assert checks["model odd"].status == "fail"
    assert checks["MLX backend"].status == "warn"
    assert checks["MLX backend"].fix is not None and "mlx[cuda]" in checks["MLX backend"].fix
    assert checks["disk"].status == "warn"
    text = _render(list(checks.values()))
    assert "mlx[cuda]" in text  # not eaten as rich markup


def test_missing_mlx_fails_with_the_install_command() -> None:
    facts = replace(
        HEALTHY,
        system="Linux",
        mlx_version=None,
        device=None,
        backend_error="libmlx.so: cannot open shared object file",
    )
    backend = _by_name(run_checks(facts))["MLX backend"]
    assert backend.status == "fail" and "libmlx.so" in backend.detail
    assert backend.fix is not None and "mlx[cpu]" in backend.fix


def test_running_server_is_listed() -> None:
    server = run_record(4242, url="http://127.0.0.1:5555", kind="serve")
    check = _by_name(run_checks(replace(HEALTHY, servers=(server,))))["server"]
    assert check.status == "ok" and "http://127.0.0.1:5555" in check.detail
    assert "t" not in check.detail.split()  # the token is not shown


def test_gather_facts_reads_this_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no claude here
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    facts = gather_facts(models=lambda: ())
    assert facts.mlx_version is not None and facts.device in ("cpu", "gpu")
    assert facts.total_memory > 0 and facts.free_disk > 0
    assert facts.claude_path is None
    assert os.path.isabs(facts.models_dir)


def test_a_cpu_only_machine_is_recommended_a_model_it_can_run() -> None:
    # The machine of the report: Linux, 2 cores, 24 GiB, MLX on its CPU backend. Memory alone
    # would pick an 8.3 GB model; two cores would take minutes per reply with it.
    cpu = replace(
        HEALTHY, system="Linux", machine="x86_64", device="cpu", total_memory=24 * GIB, models=()
    )
    two_cores = _by_name(run_checks(replace(cpu, cpu_count=2)))
    small = recommend(24 * GIB, compute=Compute("cpu", 2))
    by_memory = recommend(24 * GIB)
    assert small is not None and by_memory is not None and small != by_memory
    assert f"recommended model: {small.alias}" in two_cores["memory"].detail
    assert "CPU only (2 cores)" in two_cores["memory"].detail
    assert two_cores["models"].fix == f"mlx models pull {small.alias}"
    # The same memory behind a GPU gets the model memory allows.
    gpu = _by_name(run_checks(replace(cpu, device="gpu", cpu_count=2)))
    assert f"recommended model: {by_memory.alias}" in gpu["memory"].detail
