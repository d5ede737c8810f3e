"""`mlx stop` on a running `mlx launch` ends the agent session on it: on a terminal it asks
first (No by default, --yes does not ask), it says the session ended, and the launch says
why its agent went away (it ended with exit 143 and no word)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_process import run_quietly
from test_launch_cli import _mlx_on_a_terminal
from test_ps_stop import _state

from mlxlaunch.launch.child import run_child
from mlxlaunch.launch.state import write_state

pytestmark = pytest.mark.quick  # each starts a process; all take well under a second

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def launch_record(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str]]]:
    """A process recorded as an `mlx launch` (what `mlx stop` reads), and the environment."""
    home = tmp_path / "home"
    process = subprocess.Popen(SLEEPER)
    write_state(_state(process.pid, "demo", kind="launch"), home)
    env = {**os.environ, "MLXLAUNCH_HOME": str(home), "COLUMNS": "200"}
    try:
        yield process, env
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize("answer", ["n\n", "\n"])
def test_on_a_terminal_stopping_a_launch_is_asked_and_no_keeps_it(
    launch_record: tuple[subprocess.Popen[bytes], dict[str, str]], answer: str
) -> None:
    process, env = launch_record
    code, stderr = _mlx_on_a_terminal(["stop", str(process.pid)], env, answer)
    said = " ".join(stderr.split())
    assert code == 0, stderr
    assert f"mlx launch {process.pid} (demo): stopping ends the agent session" in said
    assert f"left running: {process.pid}" in said
    time.sleep(0.2)
    assert process.poll() is None


def test_yes_at_the_question_stops_it_and_says_the_session_ended(
    launch_record: tuple[subprocess.Popen[bytes], dict[str, str]],
) -> None:
    process, env = launch_record
    code, stderr = _mlx_on_a_terminal(["stop", str(process.pid)], env, "y\n")
    assert code == 0, stderr
    assert "the agent session on it has ended" in " ".join(stderr.split())
    assert process.wait(timeout=30) == -signal.SIGTERM


def test_with_yes_or_without_a_terminal_nothing_is_asked_and_it_still_says_so(
    launch_record: tuple[subprocess.Popen[bytes], dict[str, str]],
) -> None:
    process, env = launch_record
    done = run_quietly([sys.executable, "-m", "mlxlaunch", "stop", str(process.pid)], env, 60)
    said = " ".join(done.stderr.split())
    assert done.returncode == 0 and "?" not in said, said
    assert f"stopped {process.pid} (launch, demo)" in said and "session on it has ended" in said


def test_the_launcher_learns_which_signal_ended_its_agent() -> None:
    ended: list[int] = []

    def stop_us(_pid: int) -> None:  # `mlx stop` sends the launcher SIGTERM
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()

    code = run_child(SLEEPER, dict(os.environ), on_spawn=stop_us, on_end_signal=ended.append)
    assert code == 128 + signal.SIGTERM and ended == [signal.SIGTERM]
