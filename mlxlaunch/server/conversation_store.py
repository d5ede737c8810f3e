"""The one design for the conversations the server holds: message threads (threads.py) and
stored responses (response_store.py).

A store keeps conversations by id under a count and a byte budget (least recently used go
first) and an idle TTL. With a `directory` (the disk cache's, when there is a disk tier)
each is also a file, so it survives a restart as the KV of its conversation does;
server/conversation_files.py holds the files to the same budget whatever wrote them, and
reads and deletes only regular files named as the store names them that carry its format
marker. Without a directory (`--cache-disk 0`) it is memory only.

A subclass names its files (`format_name`, `own_id`, `what`, `noun`), says how a file reads
back as one of its conversations (`decode`), and which ids must stay while they are in use
(`busy`: a thread being continued). Thread-safe: the disk writes run off the event loop.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from mlxlaunch.server.conversation_files import ConversationFiles, ThreadLimits

log = logging.getLogger("mlxlaunch.server")

# The longest a continued conversation's KV is pinned after its last turn (see pin_s).
PIN_S = 15 * 60.0

ConversationT = TypeVar("ConversationT")


@dataclass
class Held(Generic[ConversationT]):
    """One conversation the store holds, with when it was last used and its size as JSON."""

    conversation: ConversationT
    used_at: float
    nbytes: int


class ConversationStore(Generic[ConversationT]):
    """Conversations by id, under `limits`, in memory and (with a `directory`) as files."""

    format_name: ClassVar[str]  # the marker every file begins with
    own_id: ClassVar[re.Pattern[str]]  # the ids this store gives, and so names files by
    what: ClassVar[str]  # the store's name in log lines ("threads")
    noun: ClassVar[str]  # one of its conversations ("thread")

    def __init__(
        self,
        limits: ThreadLimits | None = None,
        directory: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or ThreadLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, Held[ConversationT]] = OrderedDict()  # oldest first
        self._bytes = 0
        self._disk = ConversationFiles(
            directory, self.limits, format_name=self.format_name, own_id=self.own_id,
            clock=clock, what=self.what,
        )  # fmt: skip

    @property
    def pin_s(self) -> float:
        """How long a continued conversation's KV outranks unpinned prefixes in the cache:
        long enough for a tool loop's next turn, short of pinning it for its whole TTL."""
        return min(self.limits.ttl_s, PIN_S)

    @property
    def count(self) -> int:
        """How many conversations are held, in memory or on disk."""
        with self._lock:
            return len(self._held) + len(self._disk.index.keys() - self._held.keys())

    # --- for subclasses (with the lock held) ------------------------------------------------

    def decode(self, data: dict[str, Any], conversation_id: str) -> ConversationT | None:
        """A file's JSON as one of this store's conversations; None if it is none."""
        raise NotImplementedError

    def busy(self) -> frozenset[str]:
        """Ids in use, which neither the TTL nor the budget may take."""
        return frozenset()

    def _get(self, conversation_id: str) -> ConversationT | None:
        """The conversation `conversation_id`, now the most recently used; None if not held."""
        self._expire()
        held = self._held.get(conversation_id)
        if held is None:
            held = self._load(conversation_id)
            if held is None:
                return None
            self._held[conversation_id] = held
            self._bytes += held.nbytes
        held.used_at = self._clock()
        self._held.move_to_end(conversation_id)
        self._disk.touch(conversation_id)  # continued: the newest on disk too
        self._evict()
        return held.conversation

    def _put(
        self, conversation_id: str, conversation: ConversationT, fields: dict[str, Any]
    ) -> None:
        """Hold `conversation`, written as `fields` (after the format marker) and its time."""
        now = self._clock()
        text = json.dumps(
            {"format": self.format_name, **fields, "used_at": now}, ensure_ascii=False
        )
        nbytes = len(text.encode())
        if nbytes > self.limits.max_bytes:
            log.info(
                "%s %s: %d bytes, over the %s budget; not kept",
                self.noun, conversation_id, nbytes, self.what,
            )  # fmt: skip
            return
        self._held[conversation_id] = Held(conversation, now, nbytes)
        self._bytes += nbytes
        self._disk.write(conversation_id, text)
        self._evict()

    def _forget(self, conversation_id: str) -> None:
        held = self._held.pop(conversation_id, None)
        if held is not None:
            self._bytes -= held.nbytes
        self._disk.delete(conversation_id)

    # --- bounds ---------------------------------------------------------------------------

    def _expire(self) -> None:
        cutoff = self._clock() - self.limits.ttl_s
        busy = self.busy()
        for conversation_id in [i for i, held in self._held.items() if held.used_at < cutoff]:
            if conversation_id not in busy:
                self._forget(conversation_id)
        self._disk.enforce(busy)

    def _evict(self) -> None:
        """Least recently used first, until count and bytes fit (in memory; the files are
        held to the same budget by ConversationFiles)."""
        busy = self.busy()
        while self._held and (
            len(self._held) > self.limits.max_threads or self._bytes > self.limits.max_bytes
        ):
            oldest = next(iter(self._held))
            if oldest in busy and len(self._held) == 1:
                break
            self._forget(oldest)
        self._disk.enforce(busy)

    # --- disk -----------------------------------------------------------------------------

    def _load(self, conversation_id: str) -> Held[ConversationT] | None:
        """A file, if it is one this store wrote and is well-formed; else None (and a file
        that is none of this store's conversations is removed)."""
        found = self._disk.read(conversation_id)
        if found is None:
            return None
        data, nbytes = found
        conversation = None
        if isinstance(data, dict) and data.get("format") == self.format_name:
            conversation = self.decode(data, conversation_id)
        if conversation is None:
            log.info(
                "%s: %s.json is no %s of this server; removed",
                self.what, conversation_id, self.noun,
            )  # fmt: skip
            self._disk.delete(conversation_id)
            return None
        return Held(conversation, self._clock(), nbytes)
