"""The restart workload: a new server process, then a new session's first turn.

What a user sees the morning after: they start the server again (ours on the same cache
directory as before, so the prefixes it saved are there), start typing, and the first request
arrives a few seconds later. Each server is restarted on its own, as a real child process
started the way a user starts it, and measured alone on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mlxlaunch.bench.child import ChildServer
from mlxlaunch.bench.clients import AnthropicTarget, OpenAITarget, Target
from mlxlaunch.bench.ours import OURS_NAME
from mlxlaunch.bench.peer import PEER_NAME, PeerFailed, PeerServer
from mlxlaunch.bench.workloads import Conversation

# `mlx serve` prints this line once the model is loaded and the port is open.
_ANNOUNCEMENT = re.compile(r"serving \S+ at (http://\S+)")


class RestartFailed(PeerFailed):
    """A restarted server did not come up."""


class ServeProcess(ChildServer):
    """`python -m mlxlaunch serve` as a child process, reporting its URL when it is ready."""

    log_prefix = "mlx-bench-serve-"
    # Ctrl-C, as a user stops it: it saves what it should first.
    stop_signal = signal.SIGINT
    stop_timeout_s = 30.0

    def __init__(
        self,
        model_dir: str,
        *,
        cache_dir: Path,
        auth_token: str,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.model_dir = model_dir
        self.cache_dir = cache_dir
        self.auth_token = auth_token
        self.extra_args = extra_args
        self.url: str | None = None

    def command(self) -> list[str]:
        """The command line, as a user would type it (`mlx serve …`)."""
        return [
            sys.executable, "-m", "mlxlaunch", "serve",
            "--model", self.model_dir,
            "--port", "0",
            "--cache-dir", str(self.cache_dir),
            "--auth-token", self.auth_token,
            *self.extra_args,
        ]  # fmt: skip

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until the child announces its URL; RestartFailed if it exits or times out."""
        if self._process is None:
            raise RestartFailed("the server was never started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _ANNOUNCEMENT.search(self.log_text())
            if match:
                self.url = match.group(1)
                return
            if (code := self.exit_code()) is not None:
                raise RestartFailed(f"mlx serve exited with code {code}", hint=self.log_tail())
            time.sleep(0.05)
        raise RestartFailed(f"mlx serve was not ready in {timeout_s:.0f} s", hint=self.log_tail())


class _Restartable(Protocol):
    def start(self) -> None: ...

    def wait_ready(self, timeout_s: float = 300.0) -> None: ...

    def stop(self) -> None: ...


async def measure_restart(
    server: _Restartable,
    target_for: Callable[[], Target],
    conversation: Conversation,
    *,
    max_tokens: int,
    wait_s: float,
    ready_timeout_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Start `server`, wait until `wait_s` after the start (or until it is ready, if later),
    time `conversation`, stop the server. Raw figures, with `ready_s` and `sent_s` (seconds
    from the start to ready and to sending)."""
    start = clock()
    server.start()
    target: Target | None = None
    try:
        await asyncio.to_thread(server.wait_ready, ready_timeout_s)
        ready = clock() - start
        await asyncio.sleep(max(0.0, wait_s - (clock() - start)))
        sent = clock() - start
        target = target_for()
        timing = await target.measure(conversation, max_tokens)
    finally:
        if target is not None:
            await target.aclose()
        await asyncio.to_thread(server.stop)
    return {**timing.as_dict(), "ready_s": ready, "sent_s": sent}


async def restart_both(
    *,
    model_dir: str,
    cache_dir: Path | None,
    auth_token: str,
    peer: bool,
    conversation: Conversation,
    max_tokens: int,
    wait_s: float,
    ready_timeout_s: float,
    serve_args: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The restart workload on our server (if `cache_dir`: it was started on that directory)
    and on the peer, one after the other. Returns figures by server name and warnings."""
    results: dict[str, Any] = {}
    warnings: list[str] = []

    async def measure(
        name: str,
        server: _Restartable,
        target_for: Callable[[], Target],
        failure: type[PeerFailed],
    ) -> None:
        try:
            results[name] = await measure_restart(
                server,
                target_for,
                conversation,
                max_tokens=max_tokens,
                wait_s=wait_s,
                ready_timeout_s=ready_timeout_s,
            )
        except failure as exc:
            warnings.append(f"restart of {name} left out: {exc.message}")

    if cache_dir is not None:
        ours = ServeProcess(
            model_dir, cache_dir=cache_dir, auth_token=auth_token, extra_args=serve_args
        )
        await measure(
            OURS_NAME,
            ours,
            lambda: AnthropicTarget(OURS_NAME, ours.url or "", auth_token=auth_token),
            RestartFailed,
        )
    if peer:
        other = PeerServer(model_dir)
        try:
            await measure(PEER_NAME, other, lambda: OpenAITarget(PEER_NAME, other.url), PeerFailed)
        finally:
            with contextlib.suppress(Exception):
                other.stop()
    return results, warnings
