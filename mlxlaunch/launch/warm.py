"""Warm start: load the model and restore its cached prefixes while the user types.

`mlx launch claude` starts this the moment the engine exists. Loading posts one command to the
engine's worker, which loads the weights and then restores the model's most recently used
prefixes from the disk cache; a request that arrives meanwhile shares the same load (the
engine hands every caller one future) and queues behind the restore, so nothing loads twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from mlxlaunch.engine.models import ModelSet

log = logging.getLogger(__name__)


def warm_up_in_background(engine: ModelSet) -> threading.Thread:
    """Begin loading `engine`'s model now, without waiting; failures are logged, and the
    first request then tries the load again and reports the error itself."""

    def load() -> None:
        try:
            asyncio.run(engine.load())
        except Exception as exc:
            log.warning("background model load failed: %s", exc)

    thread = threading.Thread(target=load, name="mlxlaunch-warm-up", daemon=True)
    thread.start()
    return thread
