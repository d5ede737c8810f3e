"""Installing is quiet and small: no setuptools deprecation warning from our own metadata, no
npm notices around the pinned agents, and `make run` installs only what running needs.

The Makefile is read with `make -n` (it prints the commands without running them) against a
virtual environment that does not exist, as on a fresh clone.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from mlxlaunch.launch.agent_bin import npm_install_command as agent_npm_command
from mlxlaunch.launch.claude_bin import npm_install_command as claude_npm_command
from mlxlaunch.launch.integrations import CODEX, OPENCODE

pytestmark = pytest.mark.quick  # each starts a process; all take well under a second

REPO = Path(__file__).resolve().parents[1]


def test_the_license_is_an_spdx_expression_that_setuptools_takes_without_a_warning() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # A `{ text = ... }` table makes setuptools >= 77 warn, three times per install.
    assert project["project"]["license"] == "MIT"
    requires = project["build-system"]["requires"]
    assert "setuptools>=77" in requires  # the first release that reads an SPDX string


def _make_dry_run(target: str, tmp_path: Path) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "-C", str(REPO), target, f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def test_make_run_installs_the_package_without_the_test_and_lint_tools(tmp_path: Path) -> None:
    commands = _make_dry_run("run", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line]
    assert any(line.rstrip().endswith("install -q -e .") for line in installs), commands
    assert "[test]" not in commands


def test_make_test_still_installs_the_test_extras(tmp_path: Path) -> None:
    assert "-e '.[test]'" in _make_dry_run("test", tmp_path)


def test_make_run_says_how_to_get_mlx_on_path_at_its_end(tmp_path: Path) -> None:
    commands = _make_dry_run("run", tmp_path)
    after = commands[commands.index("mlx launch claude") :]
    assert f"{tmp_path / 'venv' / 'bin'}:" in after  # the PATH line names this venv's bin
    assert "pipx install" in after and "uv tool install" in after
    assert "exit $code" in after  # the launch's exit code is still make's


def test_npm_installs_of_every_pinned_agent_keep_npm_quiet(tmp_path: Path) -> None:
    commands = [
        claude_npm_command(tmp_path),
        *(agent_npm_command(a, tmp_path) for a in (CODEX, OPENCODE)),
    ]
    for command in commands:
        assert "--no-update-notifier" in command and "--loglevel=error" in command, command
        assert "--no-fund" in command and "--no-audit" in command, command


def test_the_readme_says_how_to_get_mlx_on_path() -> None:
    readme = (REPO / "README.md").read_text()
    assert 'export PATH="$PWD/.venv/bin:$PATH"' in readme
    assert "pipx install ." in readme and "uv tool install ." in readme
