"""The main loop first: which queued request takes a free slot, and when a step is urgent.

Claude Code's interactive turn (`kind == "main"`) is what the user waits for; side requests
(titles, summaries, subagents) are not. The worker asks here which waiting job goes next and
whether its step is urgent (the main prompt prefills in full chunks, scheduling/prefill_pacing);
a Conductor asks whether a worker is urgent (other models then step less often); the batch
admits an urgent prompt first (scheduling/batch.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from mlxlaunch.engine.scheduling.job import Job


def is_main(job: Job) -> bool:
    return job.request.kind == "main"


def prefilling(job: Job) -> bool:
    return job.last_progress < job.prompt_tokens


def next_waiting(waiting: deque[Job]) -> Job:
    """Take the oldest waiting main-loop request out of `waiting`, else the oldest one."""
    for job in waiting:
        if is_main(job):
            waiting.remove(job)
            return job
    return waiting.popleft()


def step_is_urgent(running: Iterable[Job]) -> bool:
    """Every running main-loop request still prefills (none decodes yet): its prompt goes
    first."""
    mains = [prefilling(job) for job in running if is_main(job)]
    return bool(mains) and all(mains)


def worker_is_urgent(running: Iterable[Job], waiting: Iterable[Job]) -> bool:
    """A main-loop request prefills or waits for a slot: the user waits on its first token."""
    return any(is_main(job) and prefilling(job) for job in running) or any(
        is_main(job) for job in waiting
    )
