"""SIGHUP and SIGTERM end the launcher and its child even when the child is stopped.

A closed terminal (or a supervisor's stop) used to leave `claude` stopped and the launcher
waiting on it forever: a stopped process cannot act on SIGTERM until it is continued.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deadlines import PROCESS_EXIT_S
from e2e.claude_cli import write_fake_claude

from mlxlaunch.launch.child import ChildEnding

# A launcher in its own process, with a short grace so a stubborn child is killed quickly.
LAUNCHER = """
import os, sys
from mlxlaunch.launch.child import run_child
sys.exit(run_child(sys.argv[1:], os.environ, end_grace_s=1.0))
"""

# A child that ignores every ending signal: only SIGKILL ends it.
STUBBORN = """
import json, os, signal, sys, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
with open(sys.argv[1], "w") as f:
    json.dump({"ready": True, "pid": os.getpid()}, f)
while True:
    time.sleep(1)
"""


def _wait_for_report(path: Path) -> dict:
    deadline = time.monotonic() + PROCESS_EXIT_S
    while time.monotonic() < deadline:
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError:
                data = {}
            if data.get("ready"):
                return data
        time.sleep(0.02)
    raise AssertionError("the child never became ready")


def _stopped(pid: int) -> bool:
    # Field 3 of /proc/PID/stat: T (stopped) or t (traced).
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _kill_leftover(report: Path) -> None:
    # A failing test must not leave its (possibly stopped) child behind.
    try:
        pid = json.loads(report.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    report = tmp_path / "report.json"
    env = {**os.environ, "FAKE_CLAUDE_REPORT": str(report)}
    claude = write_fake_claude(tmp_path / "bin")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(claude), "wait-signal"],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield launcher, report
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_leftover(report)


@pytest.mark.quick
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_stopped_child_is_woken_to_act_on_the_signal(
    launched: tuple[subprocess.Popen[bytes], Path], sig: signal.Signals
) -> None:
    launcher, report = launched
    child = _wait_for_report(report)["pid"]
    os.kill(child, signal.SIGSTOP)  # as SIGTTIN/SIGTSTP leave it after a terminal goes away
    deadline = time.monotonic() + PROCESS_EXIT_S
    while not _stopped(child):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    os.kill(launcher.pid, sig)
    # The child handled the very signal (it exits 40 + its number), so it was continued.
    assert launcher.wait(timeout=PROCESS_EXIT_S) == 40 + sig
    assert time.monotonic() - started < 30  # not a hang that some later SIGCONT ended
    assert json.loads(report.read_text())["signals"][:1] == [sig]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("stop_first", [True, False])
def test_a_child_that_ignores_the_signal_is_killed_after_the_grace(
    tmp_path: Path, stop_first: bool
) -> None:
    report = tmp_path / "stubborn.json"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, sys.executable, "-c", STUBBORN, str(report)],
        stdin=subprocess.DEVNULL,
    )
    try:
        child = _wait_for_report(report)["pid"]
        if stop_first:
            os.kill(child, signal.SIGSTOP)
        os.kill(launcher.pid, signal.SIGTERM)
        assert launcher.wait(timeout=PROCESS_EXIT_S) == 128 + signal.SIGKILL
        assert _gone(child)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_leftover(report)


@pytest.mark.quick
def test_an_ending_kills_the_group_after_its_grace_unless_cancelled() -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    kept, killed = (subprocess.Popen(sleep, process_group=0) for _ in range(2))
    try:
        endings = [ChildEnding(p.pid, grace_s=0.2) for p in (kept, killed)]
        for ending in endings:
            assert not ending.begun
            ending.begin()
            ending.begin()  # a second signal arms nothing more
            assert ending.begun
        endings[0].cancel()
        assert killed.wait(timeout=PROCESS_EXIT_S) == -signal.SIGKILL
        time.sleep(0.3)
        assert kept.poll() is None  # a cancelled ending kills nothing
    finally:
        for proc in (kept, killed):
            proc.kill()
            proc.wait()
