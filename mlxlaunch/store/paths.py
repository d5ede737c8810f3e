"""Where the store keeps things: the hub cache, the hub endpoint, and mlxlaunch's own home.

Everything is read from the environment at call time (not at import time, as
`huggingface_hub.constants` does) so tests and long-lived processes see the current values.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlxlaunch.home import mlxlaunch_home, private_dir

__all__ = [
    "DEFAULT_ENDPOINT",
    "hub_cache_dir",
    "hub_endpoint",
    "mlxlaunch_home",
    "private_dir",
    "registry_path",
]

DEFAULT_ENDPOINT = "https://huggingface.co"


def registry_path() -> Path:
    """The JSON file holding locally registered model directories and last-used times."""
    return mlxlaunch_home() / "models.json"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, following huggingface_hub's own precedence.

    `HF_HUB_CACHE` wins, then `HF_HOME/hub`, then `$XDG_CACHE_HOME/huggingface/hub`,
    then `~/.cache/huggingface/hub`.
    """
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_endpoint() -> str:
    """The hub's base URL: `HF_ENDPOINT` or huggingface.co, without a trailing slash."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
