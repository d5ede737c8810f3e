"""`mlx launch <agent>` run as a user would, for the end-to-end tests (a pytest plugin too).

A fresh home for each test (its own `HOME`, mlxlaunch home and config, Claude Code's config),
none of the caller's provider settings, and the launch's own log read back afterwards. The
`real_claude`, `real_codex` and `real_opencode` fixtures are the pinned agents, installed once
per machine with npm.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_process import MLX, run_quietly

__all__ = [
    "MLX",
    "git_work",
    "launch_argv",
    "launch_env",
    "real_claude",
    "real_codex",
    "real_opencode",
    "run_launch",
]

if TYPE_CHECKING:
    from mlxlaunch.launch.integrations import Integration

# Settings a developer's own shell may carry, which would point an agent elsewhere.
PROVIDER_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "OPENCODE")


@pytest.fixture(scope="session")
def real_claude() -> Path:
    """The pinned Claude Code, installed once per machine with npm."""
    from e2e.claude_cli import CLAUDE_CODE_VERSION, claude_cache_dir, install_real_claude

    binary = install_real_claude(claude_cache_dir())
    if binary is None:
        pytest.skip(f"npm is not installed: cannot install Claude Code {CLAUDE_CODE_VERSION}")
    return binary


def agent_prefix(agent: Integration) -> Path:
    """Where tests keep an agent's pinned npm install, shared across runs."""
    from e2e.claude_cli import claude_cache_dir

    return claude_cache_dir().parent / "npm-agents" / agent.name / agent.release.version


def install_pinned(agent: Integration) -> Path | None:
    """The pinned release, installed once per machine by the product's installer; None: no npm."""
    from mlxlaunch.launch.agent_bin import install_agent, pinned_binary

    binary = pinned_binary(agent, agent_prefix(agent))
    if binary.exists():
        return binary
    if subprocess.run(["which", "npm"], capture_output=True, check=False).returncode != 0:
        return None
    return install_agent(agent, agent_prefix(agent), timeout=900)


def _pinned_or_skip(agent: Integration) -> Path:
    binary = install_pinned(agent)
    if binary is None:
        pytest.skip(f"npm is not installed: cannot install {agent.title} {agent.release.version}")
    return binary


@pytest.fixture(scope="session")
def real_codex() -> Path:
    """The pinned Codex CLI, installed once per machine with npm."""
    from mlxlaunch.launch.integrations import CODEX

    return _pinned_or_skip(CODEX)


@pytest.fixture(scope="session")
def real_opencode() -> Path:
    """The pinned opencode, installed once per machine with npm."""
    from mlxlaunch.launch.integrations import OPENCODE

    return _pinned_or_skip(OPENCODE)


def git_work(tmp_path: Path) -> Path:
    """A `work` git repository under `tmp_path` (`codex exec` runs only in one, by Codex's
    own rule, which the launcher never lifts for the user), beside the user's empty home."""
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (tmp_path / "user").mkdir()
    return work


def launch_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user with a fresh home under `tmp_path`, working in its `work`,
    and no provider settings of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_PREFIXES)}
    env.update(
        HOME=str(tmp_path / "user"),  # the agents' own files stay out of the real home
        CLAUDE_CONFIG_DIR=str(tmp_path / "user" / ".claude"),
        MLXLAUNCH_HOME=str(tmp_path / "mlx"),
        MLXLAUNCH_CONFIG_DIR=str(tmp_path / "mlx-config"),
        PWD=str(tmp_path / "work"),  # opencode takes its directory from $PWD, as shells set it
    )
    return env


def launch_argv(
    mlx: Sequence[str],
    agent: str,
    model: Path | str,
    binary: Path,
    words: Sequence[str],
    *options: str,
) -> list[str]:
    """`MLX launch AGENT --model MODEL --AGENT-bin BINARY OPTIONS -- WORDS`."""
    return [*mlx, "launch", agent, "--model", str(model), f"--{agent}-bin", str(binary), *options,
            "--", *words]  # fmt: skip


def run_launch(
    argv: Sequence[str], cwd: Path, env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `argv` (an `mlx launch …` command line) to its end with no terminal; what it did,
    and the text of the launch's log in `env`'s mlxlaunch home ("" when it wrote none)."""
    done = run_quietly(argv, env, timeout, cwd)
    logs = sorted((Path(env["MLXLAUNCH_HOME"]) / "logs").glob("launch-*.log"))
    return done, "".join(log.read_text() for log in logs)
