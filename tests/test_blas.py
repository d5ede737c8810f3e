"""Loading an optimised BLAS before MLX: the search with injected paths and a fake `dlopen`,
then real processes that load it (skipped where none is installed) or keep the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxlaunch.blas import (
    ENV_CHOICE,
    BlasChoice,
    BlasLoad,
    candidate_paths,
    choose_blas,
    load_blas,
    loader_outcome,
    preload_for,
)

INSTALLED = next((p for p in candidate_paths() if p.is_file()), None)
needs_optimised = pytest.mark.skipif(
    INSTALLED is None or not sys.platform.startswith("linux"),
    reason="no optimised BLAS installed (e.g. apt-get install libopenblas0-pthread)",
)


def _libraries(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    return paths


class FakeDlopen:
    """Records the libraries it was asked to open; raises `error` if given."""

    def __init__(self, error: OSError | None = None) -> None:
        self.opened: list[str] = []
        self.error = error

    def __call__(self, path: str) -> None:
        self.opened.append(path)
        if self.error is not None:
            raise self.error


def test_the_first_installed_candidate_is_chosen(tmp_path: Path) -> None:
    pthread, openmp = _libraries(tmp_path, "pthread/libopenblas.so.0", "openmp/libopenblas.so.0")
    assert choose_blas({}, [pthread, openmp], "linux") == BlasChoice("absent")
    openmp.write_bytes(b"")
    assert choose_blas({}, [pthread, openmp], "linux") == BlasChoice("found", openmp)
    pthread.write_bytes(b"")
    assert choose_blas({}, [pthread, openmp], "linux") == BlasChoice("found", pthread)


def test_mlxlaunch_blas_names_a_library_or_keeps_the_reference(tmp_path: Path) -> None:
    [installed] = _libraries(tmp_path, "libopenblas.so.0")
    installed.write_bytes(b"")
    mine = tmp_path / "mine" / "libblis.so.4"
    assert choose_blas({ENV_CHOICE: str(mine)}, [installed], "linux") == BlasChoice(
        "explicit", mine
    )
    for value in ("reference", "Reference "):
        assert choose_blas({ENV_CHOICE: value}, [installed], "linux").source == "reference"
    assert choose_blas({ENV_CHOICE: " "}, [installed], "linux").source == "found"


def test_macos_loads_nothing(tmp_path: Path) -> None:
    [installed] = _libraries(tmp_path, "libopenblas.so.0")
    installed.write_bytes(b"")
    assert choose_blas({ENV_CHOICE: str(installed)}, [installed], "darwin").source == "not-linux"
    assert load_blas(BlasChoice("not-linux"), open_global=FakeDlopen()).outcome == "not-linux"


def test_candidates_cover_debian_multiarch_fedora_and_the_mkl_wheel() -> None:
    for machine in ("x86_64", "aarch64"):
        paths = [str(p) for p in candidate_paths(machine, "/venv")]
        assert paths[0] == f"/usr/lib/{machine}-linux-gnu/openblas-pthread/libopenblas.so.0"
        assert f"/usr/lib/{machine}-linux-gnu/openblas-openmp/libopenblas.so.0" in paths
        assert "/usr/lib64/libopenblasp.so.0" in paths
        assert "/venv/lib/libmkl_rt.so.3" in paths
        # OpenBLAS before MKL: it ran the test model's prefill as fast with fewer stalls.
        assert paths.index("/venv/lib/libmkl_rt.so.3") > paths.index("/usr/lib/libopenblas.so.0")


def test_the_chosen_library_is_opened_before_mlx(tmp_path: Path) -> None:
    [library] = _libraries(tmp_path, "libopenblas.so.0")
    library.write_bytes(b"")
    dlopen = FakeDlopen()
    load = load_blas(BlasChoice("found", library), mlx_imported=False, open_global=dlopen)
    assert load == BlasLoad("loaded", str(library))
    assert dlopen.opened == [str(library)]


def test_a_library_that_does_not_load_is_reported_not_raised(tmp_path: Path) -> None:
    [library] = _libraries(tmp_path, "libopenblas.so.0")
    library.write_bytes(b"not an ELF file")
    dlopen = FakeDlopen(OSError("invalid ELF header"))
    load = load_blas(BlasChoice("explicit", library), mlx_imported=False, open_global=dlopen)
    assert load == BlasLoad("failed", str(library), "invalid ELF header")

    missing = FakeDlopen()
    gone = load_blas(
        BlasChoice("explicit", tmp_path / "gone.so"), mlx_imported=False, open_global=missing
    )
    assert gone.outcome == "failed" and gone.error == "no such file" and missing.opened == []


def test_after_mlx_is_imported_it_is_too_late(tmp_path: Path) -> None:
    import mlx.core  # noqa: F401  (the point: mlx is in this process now)

    [library] = _libraries(tmp_path, "libopenblas.so.0")
    library.write_bytes(b"")
    dlopen = FakeDlopen()
    load = load_blas(BlasChoice("found", library), open_global=dlopen)
    assert load.outcome == "too-late" and dlopen.opened == []


def test_reference_and_absent_open_nothing() -> None:
    dlopen = FakeDlopen()
    assert load_blas(BlasChoice("reference"), open_global=dlopen).outcome == "reference"
    assert load_blas(BlasChoice("absent"), open_global=dlopen).outcome == "absent"
    assert dlopen.opened == []


def test_mkl_gets_a_threading_layer_that_exists_unless_one_is_set(tmp_path: Path) -> None:
    [mkl] = _libraries(tmp_path, "lib/libmkl_rt.so.3")
    mkl.write_bytes(b"")
    environ: dict[str, str] = {}
    load_blas(
        BlasChoice("found", mkl), environ=environ, mlx_imported=False, open_global=FakeDlopen()
    )
    # Its default (Intel OpenMP) ends the process at the first call when libiomp5 is missing.
    assert environ["MKL_THREADING_LAYER"] in {"GNU", "SEQUENTIAL"}
    chosen = {"MKL_THREADING_LAYER": "INTEL"}
    load_blas(
        BlasChoice("found", mkl), environ=chosen, mlx_imported=False, open_global=FakeDlopen()
    )
    assert chosen == {"MKL_THREADING_LAYER": "INTEL"}


def test_children_that_import_mlx_themselves_get_the_library_preloaded() -> None:
    loaded = BlasLoad("loaded", "/usr/lib/x/libopenblas.so.0")
    assert preload_for(loaded, {}) == {"LD_PRELOAD": "/usr/lib/x/libopenblas.so.0"}
    assert preload_for(loaded, {"LD_PRELOAD": "/a.so"}) == {
        "LD_PRELOAD": "/usr/lib/x/libopenblas.so.0:/a.so"
    }
    assert preload_for(loaded, {"LD_PRELOAD": "/usr/lib/x/libopenblas.so.0"}) == {}
    assert preload_for(BlasLoad("absent"), {}) == {}
    assert preload_for(None, {}) == {}


def test_the_test_session_loaded_its_blas_before_mlx() -> None:
    load = loader_outcome()
    assert load is not None, "tests/conftest.py did not call use_optimised_blas()"
    assert load.outcome != "too-late", load


# A process as `mlx` starts: the loader first, then mlx; it prints what it loaded, which library
# libmlx's matmul reaches, its rate, and whether MLX's results (BLAS and LAPACK) are right.
PROBE = """
import json
from mlxlaunch.blas import use_optimised_blas
load = use_optimised_blas()
import mlx.core as mx
import numpy as np
from mlxlaunch.blas_probe import blas_report
report = blas_report()
rng = np.random.default_rng(0)
a, b = rng.standard_normal((65, 48), np.float32), rng.standard_normal((48, 33), np.float32)
product = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))
square = rng.standard_normal((24, 24), np.float32) + 24 * np.eye(24, dtype=np.float32)
inverse = np.array(mx.linalg.inv(mx.array(square), stream=mx.cpu))
print(json.dumps({
    "outcome": load.outcome, "loaded": load.path, "name": report.name, "path": report.path,
    "optimised": report.optimised, "gflops": report.gflops,
    "matmul_error": float(np.abs(product - a.astype(np.float64) @ b).max()),
    "inverse_error": float(np.abs(inverse @ square - np.eye(24)).max()),
}))
"""


def _probe(**env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k not in (ENV_CHOICE, "LD_PRELOAD")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.quick
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mlx-cpu wheel is Linux's")
def test_reference_keeps_the_wheels_blas_and_mlx_is_right() -> None:
    result = _probe(**{ENV_CHOICE: "reference"})
    assert result["outcome"] == "reference" and result["optimised"] is False
    assert result["name"] == "reference BLAS (mlx-cpu wheel)"
    assert "mlx_cpu.libs" in str(result["path"])
    assert float(str(result["matmul_error"])) < 1e-4
    assert float(str(result["inverse_error"])) < 1e-4


@pytest.mark.slow
@needs_optimised
def test_an_installed_blas_is_the_one_mlx_uses_and_is_faster() -> None:
    result = _probe()
    assert result["outcome"] == "loaded" and result["loaded"] == str(INSTALLED)
    assert result["path"] == str(INSTALLED) and result["optimised"] is True
    assert str(result["name"]).startswith(("OpenBLAS", "MKL", "BLIS"))
    # The product still computes right on the other library: BLAS and LAPACK both bound to it.
    assert float(str(result["matmul_error"])) < 1e-4
    assert float(str(result["inverse_error"])) < 1e-4
    reference = _probe(**{ENV_CHOICE: "reference"})
    # 30-40x measured; 3x leaves room for a machine shared with other work.
    assert float(str(result["gflops"])) > 3 * float(str(reference["gflops"]))


@pytest.mark.slow
def test_the_mlx_command_module_imports_no_mlx_before_its_loader_runs() -> None:
    code = (
        "import sys, mlxlaunch.cli.main; print(sorted(m for m in sys.modules if m == 'mlx.core'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", "entry() loads the BLAS too late: mlx is imported first"
