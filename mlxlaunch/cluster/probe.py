"""What one host offers a cluster: versions, memory, mx.distributed backends, the model's files.

Run on every host before a cluster starts (`python -m mlxlaunch.cluster.probe [--model M]`,
over ssh for remote hosts); prints ONE JSON object on stdout and always exits 0.

Design: it must start fast and never crash, since its output is all the lead sees of a host:
every failure becomes a field (`errors`, `model.error`) instead of a traceback. It never
downloads and never builds: a model is either on the host or reported missing. The fingerprint
is cheap on purpose (file names and sizes, and a hash of the two small JSON files that name the
architecture and the weight layout), so it runs in milliseconds on a 400 GB model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

# Distribution names whose versions must agree across hosts (and python, for the report).
PACKAGES = ("mlx", "mlx-lm", "mlxlaunch")
PROBED_BACKENDS = ("ring", "jaccl", "mpi")
HASHED_FILES = ("config.json", "model.safetensors.index.json")


def package_versions() -> dict[str, str | None]:
    """python and each package's installed version (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) memory of this host in bytes; None where it cannot be read."""
    if sys.platform == "darwin":
        return _darwin_memory()
    try:
        memory = psutil.virtual_memory()  # MemTotal and MemAvailable of /proc/meminfo on Linux
    except (OSError, RuntimeError):
        return None, None
    return int(memory.total), int(memory.available)


def _darwin_memory() -> tuple[int | None, int | None]:
    total = _sysctl_int("hw.memsize")
    page = _sysctl_int("hw.pagesize") or 4096
    try:
        stats = subprocess.run(
            ["vm_stat"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return total, None
    pages = 0
    # Free, inactive and purgeable pages are what a new process can take without swapping.
    for line in stats.splitlines():
        key, _, value = line.partition(":")
        if key in ("Pages free", "Pages inactive", "Pages purgeable", "Pages speculative"):
            pages += int(value.strip().rstrip(".") or 0)
    return total, pages * page if pages else None


def _sysctl_int(name: str) -> int | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False
        ).stdout
        return int(out.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def backends() -> tuple[dict[str, bool], str | None]:
    """Which mx.distributed backends this host's mlx can start, and why none, if mlx fails."""
    try:
        import mlx.core as mx

        return {name: bool(mx.distributed.is_available(name)) for name in PROBED_BACKENDS}, None
    except Exception as exc:  # a broken mlx raises ImportError, OSError, RuntimeError
        return {name: False for name in PROBED_BACKENDS}, f"mlx does not load: {exc}"


def resolve_local(name: str) -> Path:
    """The directory `name` names on this host, without downloading or building anything.

    Test model names (`tiny-moe`, …) are found where the test-model cache builds them; the rest
    go through the store's resolver (paths, registered names, aliases, cached repo ids).

    Raises:
        FileNotFoundError: a test model that is not built here.
        ModelNotFound: the store's resolver finds nothing.
    """
    from mlxlaunch.testing.cache import TEST_MODELS, builder_hash, cached_models_dir

    if _is_test_model(name):
        built = cached_models_dir() / f"{name}-{builder_hash(TEST_MODELS[name])}"
        if not (built / "config.json").is_file():
            raise FileNotFoundError(f"test model {name!r} is not built on this host")
        return built
    from mlxlaunch.store.resolve import resolve_model

    return resolve_model(name, shard_ok=True).path  # a host may hold only its ranks' shard


def _is_test_model(name: str) -> bool:
    from mlxlaunch.testing.cache import is_test_model_name

    return is_test_model_name(name)


def model_files(directory: Path) -> list[tuple[str, int]]:
    """(name, size) of the model's top-level files, sorted; sizes follow hub-cache symlinks."""
    files = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        files.append((path.name, path.stat().st_size))
    return files


def fingerprint(directory: Path, files: list[tuple[str, int]]) -> str:
    """A hash that differs when two copies of a model differ in layout or architecture.

    Weight files are left to the index (hashed below), which names each one: a host that
    pulled only its pipeline shard holds fewer of them, and is the same model."""
    kept = [(name, size) for name, size in files if not name.endswith(".safetensors")]
    digest = hashlib.sha256(json.dumps(kept).encode())
    for name in HASHED_FILES:
        path = directory / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def model_facts(name: str) -> dict[str, Any]:
    """Whether `name` resolves here, where, how big its weights are, and its fingerprint."""
    facts: dict[str, Any] = {"name": name, "found": False, "test_model": _is_test_model(name)}
    try:
        directory = resolve_local(name)
        files = model_files(directory)
        facts.update(
            found=True,
            path=str(directory),
            weight_bytes=sum(size for file, size in files if file.endswith(".safetensors")),
            files=len(files),
            fingerprint=fingerprint(directory, files),
        )
    except Exception as exc:  # ModelNotFound, OSError, …: all mean "not usable here"
        facts["error"] = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return facts


def probe(model: str | None = None) -> dict[str, Any]:
    """Everything this host reports, as one JSON-ready dict; never raises."""
    errors: list[str] = []
    total, available = memory_bytes()
    found_backends, backend_error = backends()
    if backend_error:
        errors.append(backend_error)
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "executable": sys.executable,
        "system": platform.system(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "versions": package_versions(),
        "memory": {"total": total, "available": available},
        "backends": found_backends,
        "errors": errors,
    }
    if model is not None:
        facts["model"] = model_facts(model)
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlxlaunch.cluster.probe")
    parser.add_argument("--model", help="a model name, alias, repo id or path to look for")
    args = parser.parse_args(argv)
    try:
        facts = probe(args.model)
    except Exception as exc:  # a last resort: the lead still gets JSON it can read
        facts = {"errors": [f"probe failed: {type(exc).__name__}: {exc}"]}
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # os._exit skips interpreter teardown (mlx's can take a while); the JSON is flushed.
    os._exit(main())
