"""Which BLAS MLX's CPU matmul reaches in this process, and how fast it multiplies here.

`blas_report()` gives both, with what the loader (`mlxlaunch.blas`) did, for `mlx doctor`'s
BLAS check and `mlx bench`'s machine description. It imports mlx, so it runs after the loader.

The library is asked of the dynamic loader, not guessed from LD_PRELOAD or file names: libmlx
takes `cblas_sgemm` from the global scope if any library there defines it (one opened
RTLD_GLOBAL or preloaded), else from its own dependencies (the wheel's reference BLAS). `dlsym`
in those two places and `dladdr` on the result name the file, whose own symbols then tell
OpenBLAS, MKL and BLIS apart and give their version and thread count.

The rate: float32 square matmuls on MLX's CPU stream, growing from 256² while one takes under
BUDGET_S/20, then repeated for BUDGET_S; the best repetition counts. It took 0.3-0.5 s in all on
the reference BLAS here (it stops at 512², ~0.12 s a product) and 0.5-0.6 s on OpenBLAS (1024²).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxlaunch.blas import BlasLoad, loader_outcome

SYMBOL = "cblas_sgemm"  # what MLX's float32 matmul calls
PROBE_SIZES = (256, 512, 1024)
BUDGET_S = 0.3
MAX_REPEATS = 20


@dataclass(frozen=True)
class BlasReport:
    """The BLAS MLX's CPU matmul uses in this process, and its measured float32 rate."""

    name: str  # "OpenBLAS 0.3.21", "MKL 2026.2.1", "reference BLAS (mlx-cpu wheel)", …
    path: str | None  # the file that defines cblas_sgemm for libmlx; None off Linux
    optimised: bool
    gflops: float | None = None  # None: not measured
    threads: int | None = None  # the library's own thread count, where it says
    load: BlasLoad | None = None  # what the loader did (None: it did not run here)

    def describe(self) -> str:
        """One line: name, threads, file and rate."""
        text = self.name + (f", {self.threads} threads" if self.threads else "")
        if self.path and self.optimised:
            text += f" ({self.path})"
        if self.gflops is not None:
            text += f": {self.gflops:.1f} GFLOP/s float32 matmul"
        return text


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr() -> Any:
    try:
        function = ctypes.CDLL(None).dladdr  # glibc 2.34 and later
    except AttributeError:
        function = ctypes.CDLL("libdl.so.2").dladdr
    function.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    function.restype = ctypes.c_int
    return function


def _defining_file(library: ctypes.CDLL, symbol: str) -> str | None:
    """The file that defines `symbol` as `library`'s handle resolves it, or None."""
    try:
        function = getattr(library, symbol)
    except AttributeError:
        return None
    info = _DlInfo()
    address = ctypes.cast(function, ctypes.c_void_p).value
    if not _dladdr()(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.normpath(os.fsdecode(info.dli_fname))


def matmul_library() -> str | None:
    """The file whose `cblas_sgemm` libmlx calls (None off Linux, or if it cannot be told)."""
    if not sys.platform.startswith("linux"):
        return None
    found = _defining_file(ctypes.CDLL(None), SYMBOL)  # the global scope comes first
    if found:
        return found
    import mlx.core as mx

    libmlx = Path(mx.__file__).parent / "lib" / "libmlx.so"
    try:
        handle = ctypes.CDLL(str(libmlx), mode=os.RTLD_NOLOAD)  # a handle, never a second copy
    except OSError:
        return None
    return _defining_file(handle, SYMBOL)


def _symbol(library: ctypes.CDLL, name: str) -> Any:
    return getattr(library, name, None)


def identify(path: str) -> tuple[str, bool, int | None]:
    """Name, whether optimised, and thread count of the BLAS in `path` (already loaded)."""
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    except OSError:
        return Path(path).name, False, None
    if (config := _symbol(library, "openblas_get_config")) is not None:
        config.restype = ctypes.c_char_p
        words = (config() or b"OpenBLAS").decode(errors="replace").split()
        threads = _symbol(library, "openblas_get_num_threads")
        return " ".join(words[:2]), True, int(threads()) if threads else None
    if (version := _symbol(library, "MKL_Get_Version_String")) is not None:
        buffer = ctypes.create_string_buffer(256)
        version(buffer, len(buffer))
        number = re.search(r"Version (\d[\d.]*)", buffer.value.decode(errors="replace"))
        threads = _symbol(library, "MKL_Get_Max_Threads")
        name = f"MKL {number.group(1)}" if number else "MKL"
        return name, True, int(threads()) if threads else None
    if (blis := _symbol(library, "bli_info_get_version_str")) is not None:
        blis.restype = ctypes.c_char_p
        return f"BLIS {(blis() or b'').decode(errors='replace')}".strip(), True, None
    if "mlx_cpu.libs" in path:
        return "reference BLAS (mlx-cpu wheel)", False, None
    return f"BLAS in {Path(path).name}", False, None


def _matmul_seconds(a: Any, b: Any) -> float:
    import mlx.core as mx

    start = time.perf_counter()
    mx.eval(mx.matmul(a, b, stream=mx.cpu))
    return time.perf_counter() - start


def measure_matmul_gflops(budget_s: float = BUDGET_S) -> float:
    """Float32 matmul rate on MLX's CPU stream, in GFLOP/s (see the module notes)."""
    import mlx.core as mx

    for size in PROBE_SIZES:
        a = mx.random.normal((size, size), stream=mx.cpu)
        b = mx.random.normal((size, size), stream=mx.cpu)
        mx.eval(a, b)
        if size == PROBE_SIZES[0]:
            _matmul_seconds(a, b)  # the first product pays for thread start and page faults
        first = _matmul_seconds(a, b)
        if first >= budget_s / 20:
            break  # slow enough to time well
    seconds = [first]
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline and len(seconds) < MAX_REPEATS:
        seconds.append(_matmul_seconds(a, b))
    return 2 * size**3 / max(min(seconds), 1e-9) / 1e9


def blas_report(*, measure: bool = True) -> BlasReport:
    """Which BLAS MLX's CPU matmul uses here and, if `measure`, its float32 rate."""
    load = loader_outcome()
    gflops = measure_matmul_gflops() if measure else None
    if sys.platform == "darwin":
        return BlasReport("Accelerate (macOS)", None, True, gflops, load=load)
    path = matmul_library()
    if path is None:
        return BlasReport("unknown BLAS", None, False, gflops, load=load)
    name, optimised, threads = identify(path)
    return BlasReport(name, path, optimised, gflops, threads, load)
