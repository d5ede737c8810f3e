"""Finding the `claude` executable and asking it for its version."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mlxlaunch.errors import ClaudeNotFound

INSTALL_HINT = (
    "install Claude Code with `npm install -g @anthropic-ai/claude-code` "
    "(or `curl -fsSL https://claude.ai/install.sh | bash`), or pass --claude-bin PATH"
)


def find_claude(explicit: str | None = None, path: str | None = None) -> Path:
    """The `claude` to run: `explicit` if given (a path or a name on PATH), else `claude` on PATH.

    Raises ClaudeNotFound with the install command when there is none.
    """
    search_path = os.environ.get("PATH", "") if path is None else path
    name = explicit or "claude"
    if explicit and os.sep in explicit:
        candidate = Path(explicit).expanduser()
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
        raise ClaudeNotFound(f"{explicit} is not an executable file", hint=INSTALL_HINT)
    found = shutil.which(name, path=search_path)
    if found is None:
        raise ClaudeNotFound(f"`{name}` was not found on PATH", hint=INSTALL_HINT)
    return Path(found)


def claude_version(binary: Path, timeout: float = 15.0) -> str | None:
    """`claude --version`'s first line (e.g. "2.1.332 (Claude Code)"), or None if it fails."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    return lines[0].strip()
