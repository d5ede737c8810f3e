"""Stored responses, for `previous_response_id`: a continuation sends only what is new.

A request with `store` (OpenAI's default; Codex sends `false` and resends its history) has its
whole input and its output kept under the response id, as input items the next request would
send. A request naming `previous_response_id` gets those items before its own; an id the
store does not hold is a 400 `previous_response_not_found`. Unlike message threads, a stored
response can be continued any number of times (OpenAI's responses branch).

The design is message threads' (server/threads.py): a count and byte budget, least recently
used first, an idle TTL, files beside the disk KV cache when there is a disk tier
(`responses/resp_<24 hex>.json`, carrying a format marker), held to the same budget across
restarts by server/conversation_files.py, whatever wrote them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxlaunch.server.conversation_files import ConversationFiles
from mlxlaunch.server.threads import PIN_S, ThreadLimits

log = logging.getLogger("mlxlaunch.server")

FORMAT = "mlxlaunch-response-1"
_OWN_ID = re.compile(r"resp_[0-9a-f]{24}")


class ResponseStore:
    """The responses one server holds (thread-safe: disk writes run off the event loop)."""

    def __init__(
        self,
        limits: ThreadLimits | None = None,
        directory: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or ThreadLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[list[dict[str, Any]], float, int]] = OrderedDict()
        self._bytes = 0
        self._disk = ConversationFiles(
            directory, self.limits, format_name=FORMAT, own_id=_OWN_ID, clock=clock,
            what="responses",
        )  # fmt: skip

    @property
    def pin_s(self) -> float:
        """How long a continued conversation's KV is pinned (as a thread's, ThreadStore.pin_s)."""
        return min(self.limits.ttl_s, PIN_S)

    def lookup(self, response_id: str) -> list[dict[str, Any]] | None:
        """The input items of the conversation ending with `response_id`, or None."""
        with self._lock:
            self._expire()
            held = self._held.get(response_id)
            if held is None:
                held = self._read(response_id)
                if held is None:
                    return None
                self._held[response_id] = held
                self._bytes += held[2]
            items, _, nbytes = held
            self._held[response_id] = (items, self._clock(), nbytes)
            self._held.move_to_end(response_id)
            self._disk.touch(response_id)  # continued: the newest on disk too
            self._evict()
            return list(items)

    def keep(self, response_id: str, items: list[dict[str, Any]]) -> None:
        """Hold `items` (the whole conversation, the response's output included)."""
        now = self._clock()
        text = json.dumps(
            {"format": FORMAT, "id": response_id, "items": items, "used_at": now},
            ensure_ascii=False,
        )
        nbytes = len(text.encode())
        if nbytes > self.limits.max_bytes:
            log.info(
                "response %s: %d bytes, over the store's budget; not kept", response_id, nbytes
            )
            return
        with self._lock:
            self._held[response_id] = (items, now, nbytes)
            self._bytes += nbytes
            self._disk.write(response_id, text)
            self._evict()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._held)

    # --- bounds -----------------------------------------------------------------------------

    def _expire(self) -> None:
        cutoff = self._clock() - self.limits.ttl_s
        for response_id in [i for i, (_, used, _) in self._held.items() if used < cutoff]:
            self._forget(response_id)
        self._disk.enforce()

    def _evict(self) -> None:
        while self._held and (
            len(self._held) > self.limits.max_threads or self._bytes > self.limits.max_bytes
        ):
            self._forget(next(iter(self._held)))

    def _forget(self, response_id: str) -> None:
        held = self._held.pop(response_id, None)
        if held is not None:
            self._bytes -= held[2]
        self._disk.delete(response_id)

    # --- disk -------------------------------------------------------------------------------

    def _read(self, response_id: str) -> tuple[list[dict[str, Any]], float, int] | None:
        found = self._disk.read(response_id)
        if found is None:
            return None
        data, nbytes = found
        items = data.get("items") if isinstance(data, dict) else None
        if (
            data.get("format") != FORMAT
            or data.get("id") != response_id
            or not isinstance(items, list)
            or not all(isinstance(i, dict) for i in items)
        ):
            log.info("responses: %s.json is no response of this server; removed", response_id)
            self._disk.delete(response_id)
            return None
        return items, self._clock(), nbytes
