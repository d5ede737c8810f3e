"""mlxlaunch's own directory (`$MLXLAUNCH_HOME`, else the user cache dir), open to every room.

Read from the environment at call time so tests and long-lived processes see current values.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def mlxlaunch_home() -> Path:
    """The directory for mlxlaunch's own state: `MLXLAUNCH_HOME`, else the user cache dir."""
    override = os.environ.get("MLXLAUNCH_HOME")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("mlxlaunch"))
