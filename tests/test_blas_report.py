"""Which BLAS MLX uses and how fast: the probe in this process, `mlx doctor`'s BLAS check from
injected facts, and `mlx bench`'s machine description."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_doctor import HEALTHY

from mlxlaunch.blas import ENV_CHOICE, BlasLoad, candidate_paths, loader_outcome
from mlxlaunch.blas_probe import BlasReport, blas_report, measure_matmul_gflops
from mlxlaunch.launch.doctor import Check, DoctorFacts, gather_facts, run_checks, worst

LINUX = sys.platform.startswith("linux")
INSTALLED = next((p for p in candidate_paths() if p.is_file()), None) if LINUX else None
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
WHEEL_BLAS = "/venv/lib/python3.11/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"
REFERENCE = BlasReport("reference BLAS (mlx-cpu wheel)", WHEEL_BLAS, False, 2.3, None)

LINUX_CPU = replace(
    HEALTHY,
    system="Linux",
    machine="x86_64",
    device="cpu",
    models=(),
    blas=replace(REFERENCE, load=BlasLoad("absent")),
)


def _blas_check(facts: DoctorFacts) -> Check:
    [check] = [c for c in run_checks(facts) if c.name == "BLAS"]
    return check


def test_the_reference_blas_warns_with_the_package_to_install() -> None:
    checks = run_checks(LINUX_CPU)
    [check] = [c for c in checks if c.name == "BLAS"]
    assert check.status == "warn"
    assert "reference BLAS (mlx-cpu wheel)" in check.detail and "2.3 GFLOP/s" in check.detail
    assert check.fix is not None and "sudo apt-get install libopenblas0-pthread" in check.fix
    assert worst([check]) == "warn"  # slow, not broken: it never fails the doctor


def test_an_optimised_blas_is_ok_and_named_with_its_file_and_rate() -> None:
    openblas = BlasReport("OpenBLAS 0.3.21", OPENBLAS, True, 82.2, 2, BlasLoad("loaded", OPENBLAS))
    check = _blas_check(replace(LINUX_CPU, blas=openblas))
    assert check.status == "ok"
    assert check.detail == f"OpenBLAS 0.3.21, 2 threads ({OPENBLAS}): 82.2 GFLOP/s float32 matmul"


def test_a_library_that_did_not_load_is_shown_with_its_error() -> None:
    failed = BlasLoad("failed", "/opt/blas/libfoo.so", "invalid ELF header")
    check = _blas_check(replace(LINUX_CPU, blas=replace(REFERENCE, load=failed)))
    assert check.status == "warn"
    assert "/opt/blas/libfoo.so" in check.detail and "invalid ELF header" in check.detail
    assert check.fix is not None and ENV_CHOICE in check.fix


def test_the_reference_by_choice_is_information_only() -> None:
    check = _blas_check(replace(LINUX_CPU, blas=replace(REFERENCE, load=BlasLoad("reference"))))
    assert check.status == "info" and f"{ENV_CHOICE}=reference" in check.detail
    assert check.fix == f"unset {ENV_CHOICE}"


def test_macos_and_gpu_and_a_missing_mlx() -> None:
    mac = replace(LINUX_CPU, system="Darwin", machine="arm64", device="gpu", blas=None)
    assert _blas_check(mac) == Check("BLAS", "ok", "Accelerate (macOS)")
    gpu = _blas_check(replace(LINUX_CPU, device="gpu"))
    assert gpu.status == "info"  # the model's matmuls run on the GPU there
    missing = _blas_check(replace(LINUX_CPU, mlx_version=None, device=None, blas=None))
    assert missing.status == "info" and "mlx does not load" in missing.detail


def test_this_process_reports_the_blas_the_session_loaded() -> None:
    report = blas_report(measure=False)
    assert report.load == loader_outcome()
    if not LINUX:
        assert report.name == "Accelerate (macOS)"
    elif INSTALLED is not None and os.environ.get(ENV_CHOICE, "") == "":
        assert report.optimised and report.path == str(INSTALLED), report
    elif "LD_PRELOAD" not in os.environ:
        assert report.name == "reference BLAS (mlx-cpu wheel)" and not report.optimised
        assert report.path is not None and "mlx_cpu.libs" in report.path


def test_the_matmul_rate_is_measured_within_a_second() -> None:
    import time

    start = time.perf_counter()
    gflops = measure_matmul_gflops()
    assert gflops > 0.1
    assert time.perf_counter() - start < 3.0  # ~0.5 s here; room for a busy machine


def test_doctor_gathers_the_blas_of_this_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    facts = gather_facts(models=lambda: ())
    assert facts.blas is not None and facts.blas.gflops is not None and facts.blas.gflops > 0
    check = _blas_check(facts)
    assert "GFLOP/s float32 matmul" in check.detail
    if LINUX and facts.device == "cpu":
        assert check.status == ("ok" if facts.blas.optimised else "warn")


def test_bench_describes_the_blas_and_its_rate() -> None:
    from mlxlaunch.bench.machine import describe_machine

    machine = describe_machine()
    assert machine["blas_gflops"] > 0 and "GFLOP/s" in machine["blas"]
    if LINUX:
        assert machine["blas_library"] and os.path.isfile(machine["blas_library"])
    json.dumps(machine)  # the report is JSON


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="the mlx-cpu wheel is Linux's")
def test_mlx_doctor_names_the_blas_it_loaded() -> None:
    environ = {k: v for k, v in os.environ.items() if k not in (ENV_CHOICE, "LD_PRELOAD")}
    done = subprocess.run(
        [sys.executable, "-m", "mlxlaunch", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )
    [check] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "BLAS"]
    if INSTALLED is None:
        assert check["status"] == "warn" and "reference BLAS" in check["detail"]
    else:
        assert check["status"] == "ok" and str(INSTALLED) in check["detail"]
