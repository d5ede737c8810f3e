"""An optimised BLAS for MLX's CPU matmul on Linux, loaded into this process before MLX is.

`use_optimised_blas()` runs first thing in `mlx` (and the test session), without importing mlx;
`mlxlaunch.blas_probe` then tells which library MLX's matmul reaches and how fast it runs.

The Linux `mlx-cpu` wheel links a reference BLAS it bundles (`mlx_cpu.libs/libblas-*.so`), but
`libmlx.so` leaves `cblas_sgemm` and the LAPACK routines undefined, and Python loads extension
modules RTLD_LOCAL: the dynamic loader looks in the global scope first. So a BLAS opened with
RTLD_GLOBAL *before* `import mlx.core` wins, with no re-exec and no LD_PRELOAD (LD_DEBUG=bindings
shows libmlx's `cblas_sgemm` and `sgetrf_` bound to OpenBLAS). Once mlx is imported it is too late.

Measured here (2 cores shared with other work, AVX-512), float32 2048² matmul: reference
1.6-2.3 GFLOP/s, Debian's OpenBLAS 0.3.21 (pthread) 56-117, MKL 2026.2 from PyPI 86-103
(sequential) and 86-190 (GNU OpenMP threads). Prefill of 4,096 tokens on the 4-layer `large` test
model: 24.3 s reference, 3.5-5.3 s OpenBLAS, 5.2-8.3 s MKL, whose decode steps were erratic with
OpenMP threads (12-118 tokens/s), so OpenBLAS comes first. OPENBLAS_NUM_THREADS=1 and =2 measured
alike (3.5-5.0 s; 103-125 decode tokens/s), so OpenBLAS keeps its default (a thread per core)
unless the user sets it.
NumPy's bundled OpenBLAS and `scipy-openblas32` export only `scipy_`-prefixed symbols: no use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ENV_CHOICE = "MLXLAUNCH_BLAS"  # a library's path, or "reference" to keep the wheel's own
REFERENCE = "reference"

Source = Literal["explicit", "found", "reference", "absent", "not-linux"]
Outcome = Literal["loaded", "reference", "absent", "failed", "too-late", "not-linux"]


def candidate_paths(machine: str | None = None, prefix: str | None = None) -> tuple[Path, ...]:
    """Where distributions and pip put an optimised BLAS, best first.

    Debian/Ubuntu (libopenblas0-pthread, -openmp, or the alternatives link), Fedora
    (openblas-pthreads, -openmp, -serial), Arch (openblas), then MKL: the `mkl` wheel in this
    environment (`pip install mkl`), or Debian's libmkl-rt.
    """
    machine = machine or platform.machine()
    prefix = prefix or sys.prefix
    multiarch = Path("/usr/lib") / f"{machine}-linux-gnu"
    return (
        multiarch / "openblas-pthread" / "libopenblas.so.0",
        multiarch / "openblas-openmp" / "libopenblas.so.0",
        multiarch / "libopenblas.so.0",
        Path("/usr/lib64/libopenblasp.so.0"),
        Path("/usr/lib64/libopenblaso.so.0"),
        Path("/usr/lib64/libopenblas.so.0"),
        Path("/usr/lib/libopenblas.so.0"),
        Path(prefix) / "lib" / "libmkl_rt.so.3",
        Path(prefix) / "lib" / "libmkl_rt.so.2",
        multiarch / "libmkl_rt.so",
    )


@dataclass(frozen=True)
class BlasChoice:
    """Which library to load, and why: named by MLXLAUNCH_BLAS, or the first one installed."""

    source: Source
    path: Path | None = None


@dataclass(frozen=True)
class BlasLoad:
    """What the loader did in this process."""

    outcome: Outcome
    path: str | None = None
    error: str | None = None


def choose_blas(
    environ: Mapping[str, str], search: Sequence[Path], system: str = sys.platform
) -> BlasChoice:
    """The library to load: MLXLAUNCH_BLAS's if set, else the first of `search` that exists."""
    if not system.startswith("linux"):
        return BlasChoice("not-linux")  # macOS: MLX uses Accelerate and Metal
    named = environ.get(ENV_CHOICE, "").strip()
    if named.lower() == REFERENCE:
        return BlasChoice("reference")
    if named:
        return BlasChoice("explicit", Path(named).expanduser())
    found = next((p for p in search if p.is_file()), None)
    return BlasChoice("found", found) if found else BlasChoice("absent")


def _open_global(path: str) -> None:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _prepare_threads(path: Path, environ: MutableMapping[str, str]) -> None:
    # MKL's default threading layer needs Intel's libiomp5, and without it the first call ends
    # the process ("undefined symbol: omp_get_num_procs"); GNU OpenMP is nearly always there.
    if "mkl" in path.name.lower():
        layer = "GNU" if ctypes.util.find_library("gomp") else "SEQUENTIAL"
        environ.setdefault("MKL_THREADING_LAYER", layer)


def load_blas(
    choice: BlasChoice,
    *,
    environ: MutableMapping[str, str] = os.environ,
    mlx_imported: bool | None = None,
    open_global: Callable[[str], None] = _open_global,
) -> BlasLoad:
    """Open the chosen library RTLD_GLOBAL so that libmlx, loaded after it, binds to it."""
    if choice.source == "reference":
        return BlasLoad("reference")
    if choice.source == "not-linux":
        return BlasLoad("not-linux")
    if choice.path is None:
        return BlasLoad("absent")
    path = str(choice.path)
    imported = "mlx.core" in sys.modules if mlx_imported is None else mlx_imported
    if imported:
        return BlasLoad("too-late", path, "mlx was imported before the BLAS could be loaded")
    if not choice.path.is_file():
        return BlasLoad("failed", path, "no such file")
    _prepare_threads(choice.path, environ)
    try:
        open_global(path)
    except OSError as exc:
        return BlasLoad("failed", path, str(exc))
    return BlasLoad("loaded", path)


_loaded: BlasLoad | None = None


def use_optimised_blas() -> BlasLoad:
    """Load the optimised BLAS once per process; call before anything imports mlx."""
    global _loaded
    if _loaded is None:
        _loaded = load_blas(choose_blas(os.environ, candidate_paths()))
    return _loaded


def loader_outcome() -> BlasLoad | None:
    """What `use_optimised_blas()` did in this process (None: it never ran)."""
    return _loaded


def preload_for(load: BlasLoad | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The LD_PRELOAD that gives a child process the library `load` opened ({} if none)."""
    if load is None or load.outcome != "loaded" or load.path is None:
        return {}
    preload = environ.get("LD_PRELOAD", "")
    if load.path in preload.split(":"):
        return {}
    return {"LD_PRELOAD": ":".join(p for p in (load.path, preload) if p)}


def preload_environment() -> dict[str, str]:
    """LD_PRELOAD for a child that imports mlx without this loader (the bench's peer server),
    so it runs on the BLAS this process loaded. Not for claude: its tools need no BLAS."""
    return preload_for(_loaded, os.environ)
