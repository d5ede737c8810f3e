"""What a benchmark ran on: machine, BLAS, MLX build and device, and the model's shape.

Figures without this are not comparable: on Linux the `mlx-cpu` wheel links the reference BLAS,
and an optimised one (OpenBLAS, loaded by `mlxlaunch.blas` when installed) multiplies float32
matrices 30-40x faster. So the report names the library MLX's matmul reaches and its measured rate.
"""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from mlxlaunch.blas_probe import blas_report


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_machine() -> dict[str, Any]:
    """Machine, OS, Python, MLX and BLAS facts for the report."""
    import mlx.core as mx

    device = mx.default_device()
    blas = blas_report()
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
        "blas": blas.describe(),
        "blas_library": blas.path,
        "blas_gflops": None if blas.gflops is None else round(blas.gflops, 1),
        "blas_threads": blas.threads,
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
