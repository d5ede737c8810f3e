"""Serving one model from several machines: the ranks, started by `mlx.launch`, watched here.

This process (`mlx serve --hosts …`, `mlx launch claude --hosts …`) runs no MLX itself. It
checks the cluster up front (cluster/preflight.py: hosts reachable, the same versions and model
files everywhere, a model that shards that way), then starts every rank through `mlx.launch`
in a process group of its own (launch/cluster_rank.py), relays their output, and waits for
rank 0's ready line, which carries the URL clients use.

Ending is clean whichever way it comes: a stop (Ctrl-C, SIGTERM, the agent exiting) asks rank 0
to drain and stop — it tells the other ranks to exit — then terminates and finally kills the
whole group, so no rank outlives the serve. A rank that dies ends the serve: `mlx.launch`
reports it ("Node with rank N exited with code C") and stops the others, rank 0 fails the
requests in flight with an error, and `failure` says which rank on which host went.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from mlxlaunch.cluster.hosts import Cluster, is_local, launch_argv
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch.cluster_rank import READY_MARK, SPEC_VARIABLE, TOKEN_VARIABLE, RankSpec
from mlxlaunch.launch.models import ChosenModel
from mlxlaunch.launch.state import ClientSettings

# How long a cluster may take from launch to rank 0's ready line: loading a shard of a large
# model from disk on every host. Only a bound on a hang; failures end the wait at once.
READY_TIMEOUT_S = 900.0
# After asking rank 0 to stop: how long it may drain before the group is terminated, and how
# long the group then has before it is killed.
STOP_GRACE_S = 40.0
TERMINATE_GRACE_S = 5.0
RANK_MODULE = ("-m", "mlxlaunch.launch.cluster_rank")
_NODE_ENDED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


class ClusterFailed(MlxLaunchError):
    """The cluster could not start, or a rank was lost while serving."""

    exit_code = 1


@dataclass(frozen=True)
class ClusterServed:
    """A model being served by a cluster: what the announcement and clients need."""

    model: ChosenModel
    url: str
    context_window: int
    client: ClientSettings
    ranks: RankProcesses

    def running(self) -> bool:
        """Every rank still serves."""
        return self.ranks.running()

    def stopping_note(self) -> str:
        """What Ctrl-C prints."""
        return "stopping every rank…"

    @property
    def failure(self) -> str | None:
        """The first rank that ended badly, in words (None: none did)."""
        return self.ranks.failure


class RankProcesses:
    """The ranks of one serve: `mlx.launch` in its own process group, its output relayed."""

    def __init__(
        self,
        cluster: Cluster,
        spec: RankSpec,
        relay: Callable[[str], None],
        *,
        rank_command: tuple[str, ...] = RANK_MODULE,
        python: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.spec = spec
        self._relay = relay
        self._rank_command = rank_command
        self._python = python
        self.process: subprocess.Popen[str] | None = None
        self.ready: dict[str, object] | None = None
        self.failure: str | None = None  # the first rank that ended badly, in words
        self.stopping = False
        self._ready_event = threading.Event()
        self._readers: list[threading.Thread] = []
        # What this serve writes for mlx.launch (a ring's hostfile, and the per-rank hostfiles
        # and pid files mlx.launch itself makes in TMPDIR and leaves): removed by stop().
        self._scratch: Path | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The `mlx.launch` command line and its environment.

        The spec reaches every rank through `mlx.launch --env` (on a command line, so without
        the token, but saying there is one); the token reaches rank 0, always local, in its
        environment alone."""
        token = self.spec.auth_token
        public = replace(self.spec, auth_token=None, auth_required=bool(token))
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="mlxlaunch-cluster-"))
        argv = launch_argv(
            self.cluster,
            list(self._rank_command),
            python=self._python,
            env=[f"{SPEC_VARIABLE}={public.encoded()}", "PYTHONUNBUFFERED=1"],
            scratch=self._scratch,
        )
        env = {**os.environ, TOKEN_VARIABLE: token or "", "TMPDIR": str(self._scratch)}
        return argv, env

    def start(self) -> None:
        argv, env = self.command()
        self.process = subprocess.Popen(
            argv,
            # A pipe nobody writes to, not /dev/null: mlx.launch relays its stdin to the
            # ranks in a select() loop, which spins on an always-readable /dev/null (a
            # whole core, measured, taken from the ranks).
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,  # its own group: our terminal's signals are ours to pass
        )
        for stream in (self.process.stdout, self.process.stderr):
            assert stream is not None
            reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read(self, stream: IO[str]) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            if line.startswith(READY_MARK):
                with contextlib.suppress(ValueError):
                    self.ready = json.loads(line[len(READY_MARK) :])
                self._ready_event.set()
                continue
            found = _NODE_ENDED.search(line)
            if found is not None and self.failure is None:
                self.failure = self._describe_end(int(found.group(1)), found.group(2))
            self._relay(line)
        if stream is (self.process.stdout if self.process else None):
            self._ready_event.set()  # the launcher ended: nobody will say ready

    def _describe_end(self, rank: int, code: str | None) -> str | None:
        host = self.cluster.hosts[rank] if rank < self.cluster.size else "?"
        if code == "0":
            return None
        if code is None:
            how = "was killed"
        elif int(code) < 0:
            how = f"was stopped by signal {-int(code)}"
        else:
            how = f"exited with code {code}"
        if self.stopping and (code is None or int(code) in (-signal.SIGTERM, -signal.SIGKILL)):
            return None  # our own stop
        return f"rank {rank} (on {host}) {how}"

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, object]:
        """Rank 0's ready facts (url, context_window, pid).

        Raises:
            ClusterFailed: the launch ended, or did not get ready in `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while not self._ready_event.wait(0.2):
            if time.monotonic() > deadline:
                raise ClusterFailed(f"the cluster was not ready after {timeout:.0f} s")
            if self.process is not None and self.process.poll() is not None:
                break
        if self.ready is None:
            self._join_readers()
            reason = self.failure or "the ranks ended before serving"
            raise ClusterFailed(f"the cluster did not start: {reason}")
        return self.ready

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self) -> int:
        assert self.process is not None
        code = self.process.wait()
        self._join_readers()
        return code

    def stop(self) -> None:
        """Stop every rank: rank 0 first (it drains and tells the others), then the group."""
        try:
            self._stop_ranks()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None

    def _stop_ranks(self) -> None:
        process = self.process
        if process is None:
            return
        self.stopping = True
        pid = self.ready.get("pid") if self.ready else None
        if process.poll() is None and isinstance(pid, int) and is_local(self.cluster.hosts[0]):
            with contextlib.suppress(ProcessLookupError):  # SIGINT: a stop, not a lost rank
                os.kill(pid, signal.SIGINT)
            _wait(process, STOP_GRACE_S)
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 2.0)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            _wait(process, grace)
        # Whatever the launcher left in its group (a rank it did not reap) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdin is not None:
            process.stdin.close()
        self._join_readers()

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)


def _wait(process: subprocess.Popen[str], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=seconds)


@contextlib.contextmanager
def cluster_serving(
    model: ChosenModel,
    cluster: Cluster,
    spec: RankSpec,
    relay: Callable[[str], None],
    client_for: Callable[[int], ClientSettings],
    *,
    rank_command: tuple[str, ...] = RANK_MODULE,
) -> Iterator[ClusterServed]:
    """Serve `model` on `cluster` for the duration of the block, then stop every rank.

    `relay` gets each line the ranks print; `client_for(window)` the client settings for the
    served window. Raises ClusterFailed when the ranks do not get ready.
    """
    ranks = RankProcesses(cluster, spec, relay, rank_command=rank_command)
    ranks.start()
    try:
        ready = ranks.wait_ready()
        window = int(str(ready.get("context_window") or 0))
        yield ClusterServed(model, str(ready["url"]), window, client_for(window), ranks)
    finally:
        ranks.stop()
