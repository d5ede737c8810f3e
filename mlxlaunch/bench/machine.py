"""What a benchmark ran on: machine, BLAS, MLX build and device, and the model's shape.

Figures without this are not comparable: on Linux the `mlx-cpu` wheel links the reference BLAS,
and preloading an optimised one (OpenBLAS) changes float32 matmul speed by ~30x.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

OPTIMISED_BLAS = ("openblas", "mkl", "blis")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _loaded_libraries() -> str:
    # Linux only: what the dynamic loader actually mapped into this process.
    try:
        return Path("/proc/self/maps").read_text(errors="replace").lower()
    except OSError:
        return ""


def describe_blas(environ: Mapping[str, str] | None = None, loaded: str | None = None) -> str:
    """Which BLAS MLX's CPU matmul uses here, in words.

    An optimised BLAS named in LD_PRELOAD (or mapped into the process) wins; on macOS MLX uses
    Accelerate; otherwise the Linux `mlx-cpu` wheel's own reference BLAS.
    """
    environ = os.environ if environ is None else environ
    preload = environ.get("LD_PRELOAD", "")
    for name in OPTIMISED_BLAS:
        if name in preload.lower():
            library = next(p for p in preload.replace(":", " ").split() if name in p.lower())
            return f"{name} (preloaded: {library})"
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    loaded = _loaded_libraries() if loaded is None else loaded
    for name in OPTIMISED_BLAS:
        if f"lib{name}" in loaded:
            return f"{name} (linked)"
    return "reference BLAS (mlx-cpu wheel)"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_machine() -> dict[str, Any]:
    """Machine, OS, Python, MLX and BLAS facts for the report."""
    import mlx.core as mx

    device = mx.default_device()
    backend = "metal" if mx.metal.is_available() else device.type.name
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "mlx": _version("mlx") or getattr(mx, "__version__", None),
        "mlx_lm": _version("mlx-lm"),
        "mlxlaunch": _version("mlxlaunch"),
        "device": device.type.name,
        "backend": backend,
        "blas": describe_blas(),
        "ld_preload": os.environ.get("LD_PRELOAD") or None,
    }


def describe_model(model_dir: str | Path, name: str) -> dict[str, Any]:
    """The model's name, path, architecture and size, from its config and weight files."""
    directory = Path(model_dir)
    config: dict[str, Any] = {}
    config_path = directory / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
    weights = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    keys = (
        "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings",
    )  # fmt: skip
    return {
        "name": name,
        "path": str(directory),
        "weights_bytes": weights,
        "quantization": config.get("quantization"),
        **{k: config.get(k) for k in keys},
    }
