"""Long-lived threads for MLX work, reused instead of ever exiting.

MLX keeps per-thread state (e.g. its compile cache) whose destructors, run when an OS thread
exits, take the GIL. If that happens while the interpreter shuts down, the process aborts
("terminate called without an active exception"; seen with mlx 0.32 on Linux). So a thread that
has run MLX never exits: when its work returns it waits, as a daemon, for the next piece of work,
and the process can end at any moment without running those destructors.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

_idle: list[_MlxThread] = []
_idle_lock = threading.Lock()


class _MlxThread:
    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._serve, name="mlx-engine", daemon=True).start()

    def run(self, work: Callable[[], None], done: threading.Event) -> None:
        self._work.put((work, done))

    def _serve(self) -> None:
        while True:
            work, done = self._work.get()
            try:
                work()
            finally:
                with _idle_lock:
                    _idle.append(self)
                done.set()


def run_on_mlx_thread(work: Callable[[], None]) -> threading.Event:
    """Run `work` on an idle MLX thread (or a new one); the event is set when it returns."""
    with _idle_lock:
        thread = _idle.pop() if _idle else None
    if thread is None:
        thread = _MlxThread()
    done = threading.Event()
    thread.run(work, done)
    return done
