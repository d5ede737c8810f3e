"""Installing the pinned Claude Code with npm, with the user's consent.

`find_or_install` is what `mlx launch claude` calls before anything loads: the `claude` that
`find_claude` finds, else — when the user passed `--install-claude`, or said yes when asked on
a terminal — the pinned release installed into `<home>/claude-code/<version>`. Without consent
it fails with a hint that names the command. npm's own output goes straight to the terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from mlxlaunch.errors import ClaudeNotFound, MlxLaunchError
from mlxlaunch.home import private_dir
from mlxlaunch.launch.claude_bin import (
    CLAUDE_CODE_PACKAGE,
    CLAUDE_CODE_VERSION,
    find_claude,
    npm_install_command,
    pinned_claude,
    pinned_prefix,
)
from mlxlaunch.launch.node import NODE_FIX, node_facts, node_problem

Confirm = Callable[[str], bool]
Say = Callable[[str], None]


class ClaudeInstallFailed(MlxLaunchError):
    """npm is missing, or `npm install` did not leave a working `claude` behind."""

    exit_code = 6


def install_question(prefix: Path | None = None) -> str:
    """The consent question: what will be installed, where, and with which command."""
    where = prefix or pinned_prefix()
    return (
        f"Claude Code is not installed. Install {CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION} "
        f"into {where}?\n  (runs: {' '.join(npm_install_command(where))})"
    )


def install_claude_code(
    prefix: Path | None = None,
    *,
    path: str | None = None,
    timeout: float | None = None,
) -> Path:
    """Run npm to install the pinned Claude Code into `prefix`; returns its `claude`.

    `path` is the PATH to find npm on (default: $PATH); npm runs with it too.

    Raises:
        ClaudeInstallFailed: no npm, npm failed, or no executable `claude` came out of it.
    """
    where = prefix or pinned_prefix()
    npm = shutil.which("npm", path=path)
    if npm is None:
        raise ClaudeInstallFailed(
            f"npm is not on PATH: cannot install Claude Code {CLAUDE_CODE_VERSION}", hint=NODE_FIX
        )
    private_dir(where)  # nobody else may swap the binary we run
    env = None if path is None else {**os.environ, "PATH": path}
    command = npm_install_command(where, npm)
    try:
        code = subprocess.run(
            command, stdin=subprocess.DEVNULL, env=env, timeout=timeout, check=False
        ).returncode
    except subprocess.TimeoutExpired as exc:
        raise ClaudeInstallFailed(f"npm install did not finish in {timeout:.0f}s") from exc
    binary = pinned_claude(where)
    if code != 0 or not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ClaudeInstallFailed(
            f"`{' '.join(command)}` exited with {code}"
            + ("" if code else f" but left no executable at {binary}"),
            hint="npm's output above says why; or install Claude Code yourself and pass "
            "--claude-bin PATH",
        )
    return binary


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
    """The `claude` to run (see `find_claude`), installing the pinned one when none is found
    and the user agreed: `install` (the flag) or `confirm(question)` (None: cannot ask).

    An explicit `--claude-bin` that does not exist is an error, never a reason to install.

    Raises:
        ClaudeNotFound: nothing found and no consent; the hint names the install command.
        ClaudeInstallFailed: the install was tried and failed.
    """
    try:
        return find_claude(explicit, path, prefix)
    except ClaudeNotFound:
        if explicit or not (install or (confirm is not None and confirm(install_question(prefix)))):
            raise
    where = prefix or pinned_prefix()
    problem = node_problem(node_facts(path))
    if problem is not None:
        say(f"warning: {problem}; {NODE_FIX}")
    say(f"installing Claude Code {CLAUDE_CODE_VERSION} into {where} with npm…")
    binary = install_claude_code(where, path=path, timeout=timeout)
    say(f"installed: {binary}")
    return binary
