"""One MLX thread for several models: a Conductor runs each model's worker loop in turns.

MLX is driven from exactly one thread (DESIGN: concurrency model), so several loaded models
(`--small-model`, `--model A --model B`) share it: each keeps its own `Worker` (queue, batch,
prefix cache, idle unload), and the conductor's loop gives each worker one turn — one step of
its batch — per round, waiting for commands only when every worker is idle.

The main loop first: the first worker joined is the main model's. While it is `urgent` (an
interactive main-loop request is prefilling, or waits for a slot), the other workers' turns
may take at most `SIDE_SHARE` of the time the main worker's take, so a subagent on the small
model slows the turn the user waits for by at most about that share, while a cheap step (a
small model's title request beside a main prefill chunk) still runs every round; otherwise
every worker steps every round (each model's own batch keeps its own pace).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from mlxlaunch.engine.runtime.mlx_thread import run_on_mlx_thread

log = logging.getLogger(__name__)

Command = Callable[[], None]

# While the main model is urgent: the other models' turns against its own, in time.
SIDE_SHARE = 0.1
# The most steps another model takes in one round (a round ends with the commands drained).
SIDE_STEPS = 2


def drain_commands(commands: queue.SimpleQueue[Command | None], timeout: float | None) -> None:
    """Run the posted commands: wait up to `timeout` seconds for the first (None: until one
    comes; 0: only those already there), then every one already queued behind it."""
    try:
        if timeout is not None and timeout <= 0:
            command = commands.get_nowait()
        else:
            command = commands.get(timeout=timeout)
        while True:
            if command is not None:  # None only wakes the loop (a stop)
                run_command(command)
            command = commands.get_nowait()
    except queue.Empty:
        return


def run_command(command: Command) -> None:
    try:
        command()
    except Exception:  # a broken command must not take the loop down with it
        log.exception("engine command failed")


class Turns(Protocol):
    """What the conductor needs of a worker (scheduling/worker.py)."""

    @property
    def stopping(self) -> bool: ...

    @property
    def urgent(self) -> bool: ...

    def settle(self) -> bool: ...

    def wait_timeout(self) -> float | None: ...

    def turn(self, idle: bool) -> None: ...

    def wind_down(self) -> None: ...


class Conductor:
    """The MLX thread shared by several workers, which post their commands to `commands`."""

    def __init__(self) -> None:
        self.commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._members: list[tuple[Turns, threading.Event]] = []
        self._looping = False
        # Seconds of turns while the main model is urgent: its own, and the others'.
        self._main_s = 0.0
        self._side_s = 0.0

    def join(self, worker: Turns) -> threading.Event:
        """Run `worker`'s turns on the shared thread from now on; the event is set once its
        loop has wound down (after it was told to stop)."""
        ended = threading.Event()
        with self._lock:
            self._members.append((worker, ended))
            start = not self._looping
            self._looping = True
        if start:
            run_on_mlx_thread(self._run)
        else:
            self.commands.put(None)  # wake an idle loop: the newcomer may have work
        return ended

    @property
    def size(self) -> int:
        with self._lock:
            return len(self._members)

    def _run(self) -> None:
        while True:
            with self._lock:
                members = list(self._members)
                if not members:
                    self._looping = False
                    return
            idle = [worker.settle() for worker, _ in members]
            timeouts = [w.wait_timeout() for (w, _), i in zip(members, idle, strict=True) if i]
            if all(idle):
                known = [t for t in timeouts if t is not None]
                drain_commands(self.commands, min(known) if known else None)
            else:
                drain_commands(self.commands, 0.0)
            main_urgent = members[0][0].urgent
            if not main_urgent:
                self._main_s = self._side_s = 0.0
            for i, (worker, ended) in enumerate(members):
                if worker.stopping:
                    self._leave(worker, ended)
                    continue
                if not (i and main_urgent) or idle[i]:
                    started = time.perf_counter()
                    worker.turn(idle[i])
                    if main_urgent and not i:
                        self._main_s += time.perf_counter() - started
                    continue
                # The main loop first: this model steps while it is within its share of the
                # time (several cheap steps beside one long main prefill chunk; none when its
                # steps are dear), at most SIDE_STEPS in a row.
                for _ in range(SIDE_STEPS):
                    if self._side_s > SIDE_SHARE * self._main_s:
                        break
                    started = time.perf_counter()
                    worker.turn(False)
                    self._side_s += time.perf_counter() - started
                    if worker.settle():  # nothing left to do
                        break

    def _leave(self, worker: Turns, ended: threading.Event) -> None:
        try:
            worker.wind_down()
        finally:
            with self._lock:
                self._members = [m for m in self._members if m[0] is not worker]
            ended.set()
