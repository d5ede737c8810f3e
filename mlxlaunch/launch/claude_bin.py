"""Claude Code's row of the integrations table, under the names the rest of the code knows.

Claude Code is found and installed as every agent is (launch/agent_bin.py, with the row
`integrations.CLAUDE`): `--claude-bin`, then `claude` on PATH, then the pinned install under
the mlxlaunch home (`<home>/claude-code/<version>/node_modules/.bin/claude`), which
`mlx launch claude --install-claude` puts there with npm. What is here only names that row.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlxlaunch.home import mlxlaunch_home
from mlxlaunch.launch import agent_bin
from mlxlaunch.launch.integrations import (
    CLAUDE,
    CLAUDE_CODE_PACKAGE,
    CLAUDE_CODE_VERSION,
    NPM_INSTALL_FLAGS,
)

__all__ = [
    "CLAUDE_CODE_PACKAGE",
    "CLAUDE_CODE_VERSION",
    "INSTALL_FLAG",
    "NPM_INSTALL_FLAGS",
    "claude_version",
    "find_claude",
    "install_hint",
    "npm_install_command",
    "pinned_claude",
    "pinned_prefix",
]

INSTALL_FLAG = CLAUDE.install_flag


def pinned_prefix(home: Path | None = None) -> Path:
    """The npm prefix the pinned Claude Code is installed into (one directory per version)."""
    return agent_bin.pinned_prefix(CLAUDE, home or mlxlaunch_home())


def pinned_claude(prefix: Path | None = None) -> Path:
    """The `claude` executable npm links inside `prefix` (default: `pinned_prefix()`)."""
    return agent_bin.pinned_binary(CLAUDE, prefix)


def npm_install_command(prefix: Path | None = None, npm: str = "npm") -> list[str]:
    """The npm command line that installs the pinned Claude Code into `prefix`."""
    return agent_bin.npm_install_command(CLAUDE, prefix, npm)


def install_hint(prefix: Path | None = None) -> str:
    """What to run to get the pinned Claude Code, in the words of an error hint or a fix."""
    return agent_bin.install_hint(CLAUDE, prefix)


def find_claude(
    explicit: str | None = None, path: str | None = None, prefix: Path | None = None
) -> Path:
    """The `claude` to run (agent_bin.find_agent for Claude Code's row).

    Raises ClaudeNotFound, whose hint names the install command, when there is none.
    """
    return agent_bin.find_agent(CLAUDE, explicit, path, prefix)


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
