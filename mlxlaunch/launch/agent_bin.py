"""Finding an agent's executable, and installing its pinned npm release with the user's consent.

Lookup order, for every entry of the integrations table: `--<name>-bin`, then the entry's
binary on PATH, then its pinned install `<home>/<install_dir>/<version>/node_modules/.bin/<bin>`,
which `--install-<name>` (or a yes on a terminal) puts there with npm. Claude Code is one
more row (`integrations.CLAUDE`); claude_bin and claude_install name its row's functions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from mlxlaunch.errors import AgentNotFound, MlxLaunchError
from mlxlaunch.home import mlxlaunch_home, private_dir
from mlxlaunch.launch.integrations import NPM_INSTALL_FLAGS, Integration
from mlxlaunch.launch.node import NODE_FIX, node_facts, node_problem

Confirm = Callable[[str], bool]
Say = Callable[[str], None]


class AgentInstallFailed(MlxLaunchError):
    """npm is missing, or `npm install` did not leave a working executable behind."""

    exit_code = 6


def pinned_prefix(agent: Integration, home: Path | None = None) -> Path:
    """The npm prefix the pinned release is installed into (one directory per version)."""
    return (home or mlxlaunch_home()) / agent.install_dir / agent.release.version


def pinned_binary(agent: Integration, prefix: Path | None = None) -> Path:
    """The executable npm links inside `prefix` (default: `pinned_prefix(agent)`)."""
    return (prefix or pinned_prefix(agent)) / "node_modules" / ".bin" / agent.release.bin_name


def npm_install_command(
    agent: Integration, prefix: Path | None = None, npm: str = "npm"
) -> list[str]:
    """The npm command line that installs the pinned release into `prefix`."""
    where = str(prefix or pinned_prefix(agent))
    spec = f"{agent.release.package}@{agent.release.version}"
    return [npm, "install", "--prefix", where, *NPM_INSTALL_FLAGS, spec]


def install_hint(agent: Integration, prefix: Path | None = None) -> str:
    """What to run to get the pinned release, in the words of an error hint."""
    return (
        f"run `mlx launch {agent.name} {agent.install_flag}` to install {agent.title} "
        f"{agent.release.version} into {prefix or pinned_prefix(agent)} (with npm), or pass "
        f"--{agent.name}-bin PATH"
    )


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_agent(
    agent: Integration,
    explicit: str | None = None,
    path: str | None = None,
    prefix: Path | None = None,
) -> Path:
    """The executable to run (see the module doc); raises AgentNotFound with the install hint."""
    search_path = os.environ.get("PATH", "") if path is None else path
    hint = install_hint(agent, prefix)
    if explicit:
        if os.sep in explicit:
            candidate = Path(explicit).expanduser()
            if _executable(candidate):
                return candidate.resolve()
            raise AgentNotFound(f"{explicit} is not an executable file", hint=hint)
        found = shutil.which(explicit, path=search_path)
        if found is None:
            raise AgentNotFound(f"`{explicit}` was not found on PATH", hint=hint)
        return Path(found)
    found = shutil.which(agent.binary, path=search_path)
    if found is not None:
        return Path(found)
    installed = pinned_binary(agent, prefix)
    if _executable(installed):
        return installed
    raise AgentNotFound(f"`{agent.binary}` was not found on PATH nor at {installed}", hint=hint)


def install_agent(
    agent: Integration,
    prefix: Path | None = None,
    *,
    path: str | None = None,
    timeout: float | None = None,
) -> Path:
    """Run npm to install the pinned release into `prefix`; returns its executable.

    Raises:
        AgentInstallFailed: no npm, npm failed, or no executable came out of it.
    """
    where = prefix or pinned_prefix(agent)
    npm = shutil.which("npm", path=path)
    if npm is None:
        raise AgentInstallFailed(
            f"npm is not on PATH: cannot install {agent.title} {agent.release.version}",
            hint=NODE_FIX,
        )
    private_dir(where)  # nobody else may swap the binary we run
    env = None if path is None else {**os.environ, "PATH": path}
    command = npm_install_command(agent, where, npm)
    try:
        code = subprocess.run(
            command, stdin=subprocess.DEVNULL, env=env, timeout=timeout, check=False
        ).returncode
    except subprocess.TimeoutExpired as exc:
        raise AgentInstallFailed(f"npm install did not finish in {timeout:.0f}s") from exc
    binary = pinned_binary(agent, where)
    if code != 0 or not _executable(binary):
        raise AgentInstallFailed(
            f"`{' '.join(command)}` exited with {code}"
            + ("" if code else f" but left no executable at {binary}"),
            hint=f"npm's output above says why; or install {agent.title} yourself and pass "
            f"--{agent.name}-bin PATH",
        )
    return binary


def install_question(agent: Integration, prefix: Path | None = None) -> str:
    """The consent question: what will be installed, where, and with which command."""
    where = prefix or pinned_prefix(agent)
    return (
        f"{agent.title} is not installed. Install {agent.release.package}@"
        f"{agent.release.version} into {where}?\n"
        f"  (runs: {' '.join(npm_install_command(agent, where))})"
    )


def find_or_install_agent(
    agent: Integration,
    explicit: str | None = None,
    *,
    install: bool = False,
    confirm: Confirm | None = None,
    say: Say = print,
    path: str | None = None,
    prefix: Path | None = None,
    timeout: float | None = None,
) -> Path:
    """The executable to run, installing the pinned release when none is found and the user
    agreed: `install` (the flag) or `confirm(question)` (None: cannot ask). An explicit
    `--<name>-bin` that does not exist is an error, never a reason to install."""
    try:
        return find_agent(agent, explicit, path, prefix)
    except AgentNotFound:
        where = prefix or pinned_prefix(agent)
        question = install_question(agent, where)
        if explicit or not (install or (confirm is not None and confirm(question))):
            raise
    problem = node_problem(node_facts(path))
    if problem is not None:  # npm runs under node: say why it may fail before it does
        say(f"warning: {problem}; {NODE_FIX}")
    say(f"installing {agent.title} {agent.release.version} into {where} with npm…")
    binary = install_agent(agent, where, path=path, timeout=timeout)
    say(f"installed: {binary}")
    return binary
