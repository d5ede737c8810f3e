"""Running `claude` as a child that owns the terminal, with signals forwarded to it.

The child gets its own process group. When we are the terminal's foreground job, the terminal is
handed to that group (as a job-control shell does), so keyboard signals and window-size changes
reach `claude` once, straight from the kernel, and never hit the server. Signals sent to *us*
(`kill -INT`, SIGTERM from a supervisor, SIGHUP) are forwarded to the child. If the child stops
(Ctrl-Z), we take the terminal back and stop too, so the user's shell sees a stopped job; on
`fg` the terminal goes back to the child.

SIGTERM and SIGHUP mean "end": a stopped child cannot act on them, so it is also sent SIGCONT,
and if it has not exited after `END_GRACE_S` its process group is killed. From then on its
stops are no longer mirrored: the launcher never waits on a stopped child that is ending (a
closed terminal used to leave both stopped until someone sent SIGCONT).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import termios
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH, signal.SIGQUIT)
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# How long a child told to end may take before it is killed: claude restores the terminal and
# exits in well under a second; a stopped or wedged one would otherwise keep us forever.
END_GRACE_S = 5.0


def exit_code_of(wait_status: int) -> int:
    """Shell convention: the exit status, or 128 + N for a child killed by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


@dataclass
class Stdio:
    """File descriptors the child uses for stdin/stdout/stderr (None: inherit ours)."""

    stdin: int | IO[bytes] | None = None
    stdout: int | IO[bytes] | None = None
    stderr: int | IO[bytes] | None = None


def _foreground_tty() -> int | None:
    """fd 0 when it is a terminal whose foreground job is our process group, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(tty: int, pgrp: int) -> None:
    # A background group calling tcsetpgrp gets SIGTTOU unless it ignores it.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty, pgrp)
    finally:
        signal.signal(signal.SIGTTOU, previous)


class ChildEnding:
    """The end of a child that was told to end: wake it if stopped, kill it if it lingers.

    `begin()` is idempotent and safe inside a signal handler; `cancel()` once the child is
    reaped, so the timer never fires at a reused process group.
    """

    def __init__(
        self,
        pid: int,
        grace_s: float = END_GRACE_S,
        on_begin: Callable[[int], None] | None = None,
    ) -> None:
        self.pid = pid
        self.grace_s = grace_s
        self.on_begin = on_begin  # told which signal began the end (once)
        self._timer: threading.Timer | None = None

    @property
    def begun(self) -> bool:
        """True once the child was told to end."""
        return self._timer is not None

    def begin(self, signum: int = signal.SIGTERM) -> None:
        """Continue the child's group (a stopped child cannot act on SIGTERM or SIGHUP) and
        arm the kill; `signum` is the signal that asked for the end."""
        _signal_group(self.pid, signal.SIGCONT)
        if self._timer is None:
            if self.on_begin is not None:
                self.on_begin(signum)
            self._timer = threading.Timer(self.grace_s, _signal_group, (self.pid, signal.SIGKILL))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        """Disarm the kill (the child is gone)."""
        if self._timer is not None:
            self._timer.cancel()


def _signal_group(pgrp: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgrp, sig)


@contextlib.contextmanager
def _forwarding(pid: int, ending: ChildEnding) -> Iterator[None]:
    """Forward FORWARDED_SIGNALS sent to this process to `pid` while inside the block; the
    ENDING_SIGNALS also begin `ending`."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if signum in ENDING_SIGNALS:
            ending.begin(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stdio: Stdio | None = None,
    cwd: str | None = None,
    on_spawn: Callable[[int], None] | None = None,
    end_grace_s: float = END_GRACE_S,
    on_end_signal: Callable[[int], None] | None = None,
) -> int:
    """Run `argv` to completion in its own process group; returns its exit code (128+N if killed).

    `on_spawn`, if given, is called with the child's pid once it runs (tests use it).
    `end_grace_s`: how long the child may take to exit after SIGTERM or SIGHUP reached us.
    `on_end_signal`: called (in the signal handler: keep it short) with the SIGTERM or SIGHUP
    that told the child to end, so the caller can say why the session ended.
    """
    stdio = stdio or Stdio()
    tty = _foreground_tty()
    with contextlib.ExitStack() as stack:
        if tty is not None:
            stack.callback(_restore_modes, tty, _terminal_modes(tty))
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=stdio.stdin,
            stdout=stdio.stdout,
            stderr=stdio.stderr,
            process_group=0,
        )
        ending = ChildEnding(proc.pid, end_grace_s, on_end_signal)
        # Popen's own wait() cannot see stops; we reap the child ourselves below.
        stack.enter_context(_forwarding(proc.pid, ending))
        if tty is not None:
            _give_terminal(tty, proc.pid)
            stack.callback(_set_foreground, tty, os.getpgrp())
        if on_spawn is not None:
            on_spawn(proc.pid)
        try:
            status = _wait_reaping_stops(proc.pid, tty, ending)
        finally:
            ending.cancel()
        proc.returncode = exit_code_of(status)  # keeps Popen from reaping a reused pid later
    return proc.returncode


def _terminal_modes(tty: int) -> list[Any] | None:
    try:
        return termios.tcgetattr(tty)
    except termios.error:
        return None


def _restore_modes(tty: int, modes: list[Any] | None) -> None:
    # As a shell does for its jobs: a claude killed mid-screen leaves the terminal raw.
    if modes is None:
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(tty, termios.TCSADRAIN, modes)
    finally:
        signal.signal(signal.SIGTTOU, previous)


@contextlib.contextmanager
def terminating_like_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C (KeyboardInterrupt) inside this block, so a
    supervisor's stop still drains the server, frees the port and removes the state file.

    A no-op off the main thread (signal handlers can only be set there). While `claude` runs,
    `run_child` replaces these handlers with forwarding ones.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _give_terminal(tty: int, child_pgrp: int) -> None:
    _set_foreground(tty, child_pgrp)
    # The child may have stopped on SIGTTOU/SIGTTIN before it became the foreground job.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child_pgrp, signal.SIGCONT)


def _wait_reaping_stops(pid: int, tty: int | None, ending: ChildEnding) -> int:
    """Wait for `pid` to exit; mirror its stops onto ourselves when we hold a terminal, unless
    it is ending (then it is woken again, and killed once its grace is over)."""
    flags = os.WUNTRACED if tty is not None else 0
    while True:
        _, status = os.waitpid(pid, flags)  # PEP 475: retried after our signal handlers run
        if os.WIFSTOPPED(status) and ending.begun:
            _signal_group(pid, signal.SIGCONT)
            continue
        if tty is not None and os.WIFSTOPPED(status):
            _set_foreground(tty, os.getpgrp())
            os.kill(os.getpid(), signal.SIGSTOP)  # the user's shell now sees a stopped job
            _give_terminal(tty, pid)  # we were resumed by `fg`
            continue
        return status
