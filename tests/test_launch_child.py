"""The `claude` child's lifetime: exit codes, signal forwarding, its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deadlines import PROCESS_EXIT_S
from e2e.claude_cli import write_fake_claude

from mlxlaunch.launch.child import exit_code_of, run_child

# A launcher in its own process: signals must be sent to *it*, not to the test runner.
LAUNCHER = """
import os, sys
from mlxlaunch.launch.child import run_child
sys.exit(run_child(sys.argv[1:], os.environ))
"""


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _wait_ready(path: Path, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and _report(path).get("ready"):
            return _report(path)
        time.sleep(0.02)
    raise AssertionError("the fake claude never became ready")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    report = tmp_path / "report.json"
    monkeypatch.setenv("FAKE_CLAUDE_REPORT", str(report))
    return write_fake_claude(tmp_path / "bin"), report


def test_exit_code_and_args_pass_through(fake: tuple[Path, Path]) -> None:
    claude, report = fake
    code = run_child([str(claude), "exit", "3", "--weird arg", "-p"], dict(os.environ))
    assert code == 3
    seen = _report(report)
    assert seen["argv"] == ["exit", "3", "--weird arg", "-p"]
    assert seen["pgid"] == seen["pid"] != os.getpgrp()  # its own process group


def test_environment_is_exactly_what_we_pass(fake: tuple[Path, Path]) -> None:
    claude, report = fake
    env = {"PATH": os.environ["PATH"], "FAKE_CLAUDE_REPORT": str(report), "ONLY_THIS": "1"}
    assert run_child([str(claude), "exit", "0"], env) == 0
    seen = _report(report)["env"]
    assert seen["ONLY_THIS"] == "1"
    assert "PYTEST_CURRENT_TEST" not in seen


def test_killed_child_gives_128_plus_signal() -> None:
    code = run_child(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"], dict(os.environ)
    )
    assert code == 128 + 9
    assert exit_code_of(0) == 0


@pytest.mark.quick
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH])
def test_signals_sent_to_the_launcher_reach_the_child(
    fake: tuple[Path, Path], sig: signal.Signals
) -> None:
    claude, report = fake
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(claude), "wait-signal"], env=dict(os.environ)
    )
    try:
        _wait_ready(report)
        os.kill(launcher.pid, sig)
        # The launcher survives the signal and exits with the child's code.
        assert launcher.wait(timeout=PROCESS_EXIT_S) == 40 + sig
        assert _report(report)["signals"][:1] == [sig]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# The launcher as an interactive shell would start it: session leader on a terminal (a pty).
TTY_LAUNCHER = """
import fcntl, os, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
from mlxlaunch.launch.child import run_child
code = run_child(sys.argv[1:], os.environ)
# The terminal must be ours again after the child is gone.
assert os.tcgetpgrp(0) == os.getpgrp(), "terminal not given back"
sys.exit(code)
"""


def _launch_on_pty(claude: Path) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    launcher = subprocess.Popen(
        [sys.executable, "-c", TTY_LAUNCHER, str(claude), "wait-signal"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    return launcher, master


@pytest.mark.quick
@pytest.mark.parametrize("key", ["ctrl-c", "resize"])
def test_terminal_signals_reach_the_child_exactly_once(fake: tuple[Path, Path], key: str) -> None:
    import fcntl
    import struct
    import termios

    claude, report = fake
    launcher, master = _launch_on_pty(claude)
    try:
        assert _wait_ready(report)["foreground"] is True  # the terminal was handed over
        if key == "ctrl-c":
            os.write(master, b"\x03")
            expected = signal.SIGINT
        else:
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
            expected = signal.SIGWINCH
        assert launcher.wait(timeout=PROCESS_EXIT_S) == 40 + expected
        assert _report(report)["signals"] == [expected]
    finally:
        os.close(master)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
