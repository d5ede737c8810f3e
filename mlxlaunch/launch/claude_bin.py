"""Finding the `claude` executable, and the one pinned Claude Code that mlxlaunch installs.

Lookup order: `--claude-bin`, then `claude` on PATH, then the pinned install under the
mlxlaunch home (`<home>/claude-code/<version>/node_modules/.bin/claude`), which
`mlx launch claude --install-claude` puts there with npm (see `claude_install`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mlxlaunch.errors import ClaudeNotFound
from mlxlaunch.home import mlxlaunch_home

# The Claude Code release this product is tested against (its captured requests live in
# tests/fixtures/claude-code-<version>). The Makefile and the end-to-end tests read it from here.
CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
INSTALL_FLAG = "--install-claude"
CLAUDE_CODE_PACKAGE_SPEC = f"{CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION}"


def pinned_prefix(home: Path | None = None) -> Path:
    """The npm prefix the pinned Claude Code is installed into (one directory per version)."""
    return (home or mlxlaunch_home()) / "claude-code" / CLAUDE_CODE_VERSION


def pinned_claude(prefix: Path | None = None) -> Path:
    """The `claude` executable npm links inside `prefix` (default: `pinned_prefix()`)."""
    return (prefix or pinned_prefix()) / "node_modules" / ".bin" / "claude"


# How every pinned agent is installed: npm's audit, funding and update notices, and its
# dependencies' deprecation warnings, are noise to a user who asked for one exact release;
# errors still show (the install's failure hint points at them). An exact version never
# changes, so npm's cache is as good as the registry: a reinstall needs no network.
NPM_INSTALL_FLAGS = (
    "--no-audit",
    "--no-fund",
    "--no-update-notifier",
    "--loglevel=error",
    "--prefer-offline",
)


def npm_install_command(prefix: Path | None = None, npm: str = "npm") -> list[str]:
    """The npm command line that installs the pinned Claude Code into `prefix`."""
    where = str(prefix or pinned_prefix())
    return [npm, "install", "--prefix", where, *NPM_INSTALL_FLAGS, CLAUDE_CODE_PACKAGE_SPEC]


def install_hint(prefix: Path | None = None) -> str:
    """What to run to get the pinned Claude Code, in the words of an error hint or a fix."""
    where = prefix or pinned_prefix()
    return (
        f"run `mlx launch claude {INSTALL_FLAG}` to install Claude Code {CLAUDE_CODE_VERSION} "
        f"into {where} (with npm), or pass --claude-bin PATH"
    )


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_claude(
    explicit: str | None = None, path: str | None = None, prefix: Path | None = None
) -> Path:
    """The `claude` to run: `explicit` (a path or a name on PATH) if given, else `claude` on
    PATH (`path`, default $PATH), else the pinned install in `prefix` (default:
    `pinned_prefix()`).

    Raises ClaudeNotFound, whose hint names the install command, when there is none.
    """
    search_path = os.environ.get("PATH", "") if path is None else path
    if explicit:
        if os.sep in explicit:
            candidate = Path(explicit).expanduser()
            if _executable(candidate):
                return candidate.resolve()
            raise ClaudeNotFound(f"{explicit} is not an executable file", hint=install_hint())
        found = shutil.which(explicit, path=search_path)
        if found is None:
            raise ClaudeNotFound(f"`{explicit}` was not found on PATH", hint=install_hint())
        return Path(found)
    found = shutil.which("claude", path=search_path)
    if found is not None:
        return Path(found)
    installed = pinned_claude(prefix)
    if _executable(installed):
        return installed
    raise ClaudeNotFound(
        f"`claude` was not found on PATH nor at {installed}", hint=install_hint(prefix)
    )


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
