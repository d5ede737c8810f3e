"""mlxlaunch's own directory (`$MLXLAUNCH_HOME`, else the user cache dir), open to every room.

Read from the environment at call time so tests and long-lived processes see current values.

Directories mlxlaunch creates are made with explicit modes (`private_dir`, `shared_dir`), not
with `mkdir(parents=True)`: that creates missing parents with the umask's mode, so under
`umask 000` the home holding tokens, logs with prompts and the prompt cache came out 0777.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PRIVATE_DIR_MODE = 0o700  # run state (tokens), logs and caches (prompts): this user only
PRIVATE_FILE_MODE = 0o600
SHARED_DIR_MODE = 0o755  # model directories: readable by all, writable by this user


def mlxlaunch_home() -> Path:
    """The directory for mlxlaunch's own state: `MLXLAUNCH_HOME`, else the user cache dir."""
    override = os.environ.get("MLXLAUNCH_HOME")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("mlxlaunch"))


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents readable by this user only, whatever the umask;
    returns `path`. Directories that already exist keep their mode (a home the user chose)."""
    return make_dirs(path, PRIVATE_DIR_MODE)


def shared_dir(path: Path) -> Path:
    """Create `path` and its missing parents as 0755, whatever the umask; returns `path`."""
    return make_dirs(path, SHARED_DIR_MODE)


def make_dirs(path: Path, mode: int) -> Path:
    """`mkdir -p` where every directory it creates gets exactly `mode`.

    Each one is created with `mode` (the umask can only remove bits, so it is never wider,
    not even for a moment) and then set to it (in case the umask removed some). Raises
    FileExistsError when `path` or a parent exists but is not a directory, like `mkdir`.
    """
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for directory in reversed(missing):  # outermost first
        try:
            os.mkdir(directory, mode)
        except FileExistsError:  # created meanwhile by another process: not ours to change
            continue
        os.chmod(directory, mode)
    if not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a directory")
    return path
