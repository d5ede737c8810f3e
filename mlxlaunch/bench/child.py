"""A server the bench runs as a child process: start it, read its log, stop it.

Both the peer (`mlx_lm.server`) and a restarted `mlx serve` run this way, exactly as a user
starts them, in the bench's own environment (same BLAS and thread settings).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from mlxlaunch.blas import preload_environment


class ChildServer:
    """A child process with its output in a temporary log. Subclasses give `command()` and
    `wait_ready()`; `stop_signal` is how a user would stop it."""

    log_prefix = "mlx-bench-"
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout_s = 10.0
    # A child that starts processes of its own (a cluster serve's ranks) runs in a process
    # group of its own, so a kill after the timeout reaches every one of them.
    own_process_group = False

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        """The command line the child runs."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the child (returns at once; the model loads in the background)."""
        # Open for the child's whole life (closed in stop()), so not a `with` block.
        self._log = tempfile.NamedTemporaryFile(prefix=self.log_prefix, suffix=".log")  # noqa: SIM115
        self._process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # The peer imports mlx without our loader: LD_PRELOAD gives it the same BLAS.
            env={**os.environ, **preload_environment(), "PYTHONUNBUFFERED": "1"},
            start_new_session=self.own_process_group,
        )

    def log_text(self) -> str:
        """Everything the child has printed so far."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the child's output, for error messages."""
        return self.log_text()[-chars:]

    def exit_code(self) -> int | None:
        """The child's exit code once it has exited; None while it runs (or before start)."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> None:
        """Send `stop_signal`; kill the child if it has not exited after `stop_timeout_s`."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(self.stop_signal)
            try:
                self._process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _kill(self) -> None:
        """SIGKILL the child (and its process group, if it has one of its own)."""
        assert self._process is not None
        if self.own_process_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        else:
            self._process.kill()
