"""The store's own small registry: local model directories added by name, and last-used times.

One JSON file (`paths.registry_path()`), written atomically:
    {"local": {"<name>": "<absolute path>"}, "last_used": {"<repo id or name>": <unix time>}}
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mlxlaunch.store.paths import private_dir, registry_path


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    data.setdefault("local", {})
    data.setdefault("last_used", {})
    return data


def _save(path: Path, data: dict[str, Any]) -> None:
    private_dir(path.parent)  # the home: created 0700 whatever the umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".models-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)  # readers never see half a file


def local_models(path: Path | None = None) -> dict[str, Path]:
    """Registered local directories: name -> path."""
    data = _load(path or registry_path())
    return {str(k): Path(v) for k, v in data["local"].items()}


def register_local(name: str, directory: Path, path: Path | None = None) -> None:
    """Register `directory` under `name` (replacing an earlier registration of that name)."""
    file = path or registry_path()
    data = _load(file)
    data["local"][name] = str(directory.resolve())
    _save(file, data)


def unregister_local(name: str, path: Path | None = None) -> bool:
    """Forget the local model `name`; True when it was registered."""
    file = path or registry_path()
    data = _load(file)
    existed = data["local"].pop(name, None) is not None
    data["last_used"].pop(name, None)
    if existed:
        _save(file, data)
    return existed


def mark_used(key: str, when: float | None = None, path: Path | None = None) -> None:
    """Record that the model `key` (repo id or local name) was just used."""
    file = path or registry_path()
    data = _load(file)
    data["last_used"][key] = time.time() if when is None else when
    _save(file, data)


def last_used(path: Path | None = None) -> dict[str, float]:
    """Model key -> last time it was used (unix seconds)."""
    data = _load(path or registry_path())
    return {str(k): float(v) for k, v in data["last_used"].items()}
