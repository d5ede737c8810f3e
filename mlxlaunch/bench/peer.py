"""mlx-lm's own server as the peer: started on loopback as a child process, stopped after.

It runs exactly as a user would run it (`python -m mlx_lm.server --model DIR --port P`, default
flags, plus `--draft-model` in the speculative workload), in the same environment, so it gets
the same BLAS and thread settings as the bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from pathlib import Path

import httpx

from mlxlaunch.bench.child import ChildServer
from mlxlaunch.bench.clients import OpenAITarget
from mlxlaunch.errors import MlxLaunchError

PEER_NAME = "mlx_lm.server"
# The peer as the speculative workload runs it: drafting with a small model.
PEER_DRAFT_NAME = f"{PEER_NAME} --draft-model"


class PeerFailed(MlxLaunchError):
    """The peer server could not be started or stopped answering."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class PeerServer(ChildServer):
    """A `mlx_lm.server` child process: `start()`, then `wait_ready()`, then `stop()`."""

    log_prefix = "mlx-bench-peer-"

    def __init__(
        self, model_dir: str | Path, *, port: int | None = None, extra_args: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self.model_dir = str(model_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = extra_args  # beyond the defaults, e.g. `--draft-model DIR`

    def command(self) -> list[str]:
        """The command line the peer runs with."""
        return [
            sys.executable, "-m", "mlx_lm.server",
            "--model", self.model_dir,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.extra_args,
        ]  # fmt: skip

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until `/health` answers 200; raise PeerFailed if the child dies or times out."""
        if self._process is None:
            raise PeerFailed("the peer server was never started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (code := self.exit_code()) is not None:
                raise PeerFailed(f"{PEER_NAME} exited with code {code}", hint=self.log_tail())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise PeerFailed(
            f"{PEER_NAME} did not become ready in {timeout_s:.0f} s", hint=self.log_tail()
        )


async def ready_target(
    peer: PeerServer, timeout_s: float, warnings: list[str], workload: str, name: str = PEER_NAME
) -> OpenAITarget | None:
    """The peer as a target once it is ready (it was started earlier, to load meanwhile);
    None, and a warning saying why, when it did not become ready."""
    try:
        await asyncio.to_thread(peer.wait_ready, timeout_s)
    except PeerFailed as exc:
        warnings.append(f"{name} left out of the {workload}: {exc.message}")
        return None
    return OpenAITarget(name, peer.url)
