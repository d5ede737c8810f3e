"""mlx-lm's own server as the peer: started on loopback as a child process, stopped after.

It runs exactly as a user would run it (`python -m mlx_lm.server --model DIR --port P`, default
flags), in the same environment, so it gets the same BLAS and thread settings as the bench.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx

from mlxlaunch.errors import MlxLaunchError

PEER_NAME = "mlx_lm.server"


class PeerFailed(MlxLaunchError):
    """The peer server could not be started or stopped answering."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class PeerServer:
    """A `mlx_lm.server` child process: `start()`, then `wait_ready()`, then `stop()`."""

    def __init__(self, model_dir: str | Path, *, port: int | None = None) -> None:
        self.model_dir = str(model_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        """The command line the peer runs with."""
        return [
            sys.executable, "-m", "mlx_lm.server",
            "--model", self.model_dir,
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip

    def start(self) -> None:
        """Start the child process (returns at once; the model loads in the background)."""
        # Open for the child's whole life (closed in stop()), so not a `with` block.
        self._log = tempfile.NamedTemporaryFile(prefix="mlx-bench-peer-", suffix=".log")  # noqa: SIM115
        self._process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the child's output, for error messages."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until `/health` answers 200; raise PeerFailed if the child dies or times out."""
        if self._process is None:
            raise PeerFailed("the peer server was never started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PeerFailed(
                    f"{PEER_NAME} exited with code {self._process.returncode}",
                    hint=self.log_tail(),
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise PeerFailed(
            f"{PEER_NAME} did not become ready in {timeout_s:.0f} s", hint=self.log_tail()
        )

    def stop(self) -> None:
        """Terminate the child (kill it if it doesn't exit within 10 s)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
