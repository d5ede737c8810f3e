"""Installing the pinned Claude Code with npm, with the user's consent: Claude Code's row of
launch/agent_bin.py, under the names the rest of the code knows.

`find_or_install` is what `mlx launch claude` calls before anything loads: the `claude` that
`find_claude` finds, else — when the user passed `--install-claude`, or said yes when asked on
a terminal — the pinned release installed into `<home>/claude-code/<version>`. Without consent
it fails with a hint that names the command. npm's own output goes straight to the terminal.
"""

from __future__ import annotations

from pathlib import Path

from mlxlaunch.launch import agent_bin
from mlxlaunch.launch.agent_bin import AgentInstallFailed, Confirm, Say
from mlxlaunch.launch.integrations import CLAUDE

ClaudeInstallFailed = AgentInstallFailed  # its name from before Claude Code was a row

__all__ = ["ClaudeInstallFailed", "find_or_install", "install_claude_code", "install_question"]


def install_question(prefix: Path | None = None) -> str:
    """The consent question: what will be installed, where, and with which command."""
    return agent_bin.install_question(CLAUDE, prefix)


def install_claude_code(
    prefix: Path | None = None, *, path: str | None = None, timeout: float | None = None
) -> Path:
    """Run npm to install the pinned Claude Code into `prefix`; returns its `claude`.

    Raises:
        ClaudeInstallFailed: no npm, npm failed, or no executable `claude` came out of it.
    """
    return agent_bin.install_agent(CLAUDE, prefix, path=path, timeout=timeout)


def find_or_install(
    explicit: str | None = None,
    *,
    install: bool = False,
    confirm: Confirm | None = None,
    say: Say = print,
    path: str | None = None,
    prefix: Path | None = None,
    timeout: float | None = None,
) -> Path:
    """The `claude` to run, installing the pinned one when none is found and the user agreed
    (agent_bin.find_or_install_agent for Claude Code's row)."""
    return agent_bin.find_or_install_agent(
        CLAUDE,
        explicit,
        install=install,
        confirm=confirm,
        say=say,
        path=path,
        prefix=prefix,
        timeout=timeout,
    )
