"""End to end: `mlx launch codex|opencode --model demo` with the real pinned CLIs does what the
help's example promises: the demo model calls the agent's own shell tool, the agent runs it,
and the demo reports the tool's output. (Claude Code's round trip: tests/test_demo.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e.launching import launch_argv, launch_env, run_launch

from mlxlaunch.testing.demo import DEMO_FILE_TEXT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MLX = [sys.executable, "-m", "mlxlaunch"]


def _launch(tmp_path: Path, agent: str, binary: Path, words: list[str]) -> tuple[str, Path]:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "user").mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)  # codex exec's own rule
    argv = launch_argv(MLX, agent, "demo", binary, words)
    done, log = run_launch(argv, work, launch_env(tmp_path), timeout=420)
    said = done.stdout + done.stderr + log
    assert done.returncode == 0, said
    return said, work


def test_codex_exec_on_the_demo_runs_exec_command(tmp_path: Path, real_codex: Path) -> None:
    said, work = _launch(tmp_path, "codex", real_codex, ["exec", "create the file proof.txt"])
    assert (work / "proof.txt").read_text().strip() == DEMO_FILE_TEXT, said
    assert "The exec_command call ran" in said, said


def test_opencode_run_on_the_demo_runs_bash(tmp_path: Path, real_opencode: Path) -> None:
    said, work = _launch(tmp_path, "opencode", real_opencode, ["run", "create the file proof.txt"])
    assert (work / "proof.txt").read_text().strip() == DEMO_FILE_TEXT, said
    assert "The bash call ran" in said, said
