"""One MLX thread for several models: a Conductor runs each model's worker loop in turns.

MLX is driven from exactly one thread (DESIGN: concurrency model), so several loaded models
(`--small-model`, `--model A --model B`) share it: each keeps its own `Worker` (queue, batch,
prefix cache, idle unload), and the conductor's loop gives each worker one turn — one step of
its batch — per round, waiting for commands only when every worker is idle.

The main loop first: the first worker joined is the main model's. While it is `urgent` (an
interactive main-loop request is prefilling, or waits for a slot), the other workers step only
every `SIDE_EVERY` rounds, so a title request or a subagent on the small model slows the turn
the user waits for by at most about 1/`SIDE_EVERY` of a side step per main step; otherwise
every worker steps every round (each model's own batch keeps its own pace).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from mlxlaunch.engine.runtime.mlx_thread import run_on_mlx_thread

log = logging.getLogger(__name__)

Command = Callable[[], None]

# While the main model is urgent, another model steps once in this many rounds.
SIDE_EVERY = 4


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
        self._round = 0

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
            self._round += 1
            main_urgent = members[0][0].urgent
            for i, (worker, ended) in enumerate(members):
                if worker.stopping:
                    self._leave(worker, ended)
                    continue
                if i and main_urgent and not idle[i] and self._round % SIDE_EVERY:
                    continue  # the main loop first: this model waits this round
                worker.turn(idle[i])

    def _leave(self, worker: Turns, ended: threading.Event) -> None:
        try:
            worker.wind_down()
        finally:
            with self._lock:
                self._members = [m for m in self._members if m[0] is not worker]
            ended.set()
