"""Message threads held by the server: a `continue` sends only what is new.

The SDKs' tool runners (`beta.messages.tool_runner`, `toolRunner`) and
`client.beta.messages.thread()` use the message-threads beta by default (protocol/threads.py).
A request with `thread: {"type": "create"}` runs as usual, and its conversation — system,
tools, messages and the reply — is kept under the reply's message id. A request with
`{"type": "continue", "previous_message_id": id}` gets that conversation prepended to its own
messages, with the thread's system and tools, and runs the whole of it; its reply becomes the
thread's new tip. Threads are linear, as Anthropic's are: a reply continues once.

What the store cannot serve is an error whose `error.details.error_code` the SDKs act on
(`thread_not_found` and friends: replay the full history under a new thread;
`thread_unsupported_request`: stop threading), so a lost thread costs a resend, never a turn.

Bounds: a count and a byte budget (least recently used first) and an idle TTL. With a
`directory` (the disk cache's, when there is a disk tier), threads are also files, so they
survive a restart as the KV of their conversation does; server/conversation_files.py holds
them to the same budget whatever wrote them, and reads and deletes only regular files named as
this store names them (`msg_<24 hex>.json`) that carry its format marker.
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
from typing import Any

from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.responses import Message
from mlxlaunch.protocol.threads import THREAD_ERRORS, ThreadContinue, ThreadErrorCode
from mlxlaunch.server.conversation_files import ConversationFiles, ThreadLimits
from mlxlaunch.server.errors import ApiError

log = logging.getLogger("mlxlaunch.server")

FORMAT = "mlxlaunch-thread-1"
# The ids this server gives replies (server/blocks.py new_message_id) and so names files by.
_OWN_ID = re.compile(r"msg_[0-9a-f]{24}")
# Fields a thread holds; a `continue` that repeats one is refused (the SDKs never send them).
CREATE_ONLY = ("system", "tools")
# The longest a thread's KV is pinned after its last turn (see ThreadStore.pin_s).
PIN_S = 15 * 60.0
# How many continued ids are remembered, to answer `thread_already_continued`.
_TOMBSTONES = 4096


@dataclass
class HeldThread:
    """One thread's tip: the whole conversation up to and including the reply `message_id`."""

    message_id: str
    system: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    used_at: float
    nbytes: int = 0

    def as_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "message_id": self.message_id,
                "system": self.system,
                "tools": self.tools,
                "messages": self.messages,
                "used_at": self.used_at,
            },
            ensure_ascii=False,
        )


@dataclass
class ThreadTurn:
    """A threaded request in flight: what its reply will be kept with."""

    continues: str | None  # the previous reply's id; None for a `create`
    system: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]  # the whole conversation this turn sends to the model
    done: bool = False


def thread_error(code: ThreadErrorCode, message: str, **details: Any) -> ApiError:
    """The error the SDKs read `error.details.error_code` from, with its type and status
    (`THREAD_ERRORS`)."""
    error_type, status = THREAD_ERRORS[code]
    return ApiError(error_type, message, status=status, details={"error_code": code, **details})


def _dump(items: list[Any] | None) -> list[dict[str, Any]] | None:
    if items is None:
        return None
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]


def reply_message(reply: Message) -> dict[str, Any]:
    """The reply as the next request would send it back: an assistant message."""
    content = [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in reply.content
    ]
    return {"role": "assistant", "content": content}


class ThreadStore:
    """The threads one server holds (thread-safe: the disk writes run off the event loop)."""

    def __init__(
        self,
        limits: ThreadLimits | None = None,
        directory: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or ThreadLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, HeldThread] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._in_flight: set[str] = set()
        self._continued: OrderedDict[str, None] = OrderedDict()
        self._disk = ConversationFiles(
            directory, self.limits, format_name=FORMAT, own_id=_OWN_ID, clock=clock, what="threads"
        )

    # --- a request's turn ---------------------------------------------------------------

    def open(self, body: MessagesRequest) -> tuple[MessagesRequest, ThreadTurn | None]:
        """The request to run for `body` (the whole conversation for a `continue`) and its
        turn, or `(body, None)` for an unthreaded request. Raises the thread 400s."""
        thread = body.thread
        if thread is None:
            return body, None
        messages = _dump(body.messages) or []
        if not isinstance(thread, ThreadContinue):
            return body, ThreadTurn(None, _dump(body.system), _dump(body.tools), messages)
        repeated = [name for name in CREATE_ONLY if getattr(body, name) is not None]
        if repeated:
            raise thread_error(
                "thread_unsupported_request",
                f"a thread keeps the {' and '.join(repeated)} it was created with; a "
                "`continue` must not send them (start a new thread to change them)",
                unsupported=repeated,
            )
        previous = thread.previous_message_id
        with self._lock:
            held = self._lookup(previous)
            if previous in self._in_flight:
                raise thread_error(
                    "thread_continue_in_flight",
                    f"thread {previous} is being continued by another request",
                )
            if held is None:
                if previous in self._continued:
                    raise thread_error(
                        "thread_already_continued", f"thread {previous} was already continued"
                    )
                raise thread_error(
                    "thread_not_found",
                    f"no thread ends at {previous} on this server (never created, expired or "
                    "evicted); send the whole conversation",
                )
            self._in_flight.add(previous)
            held.used_at = self._clock()
        whole = [*held.messages, *messages]
        try:
            expanded = MessagesRequest.model_validate(
                {
                    **body.model_dump(mode="json", by_alias=True, exclude_none=True),
                    "thread": None,
                    "system": held.system,
                    "tools": held.tools,
                    "messages": whole,
                }
            )
        except ValueError as exc:  # a stored file that reads back as no valid conversation
            self.release(ThreadTurn(previous, None, None, []))
            raise thread_error(
                "thread_not_found",
                f"thread {previous} could not be restored; send the whole conversation",
            ) from exc
        return expanded, ThreadTurn(previous, held.system, held.tools, whole)

    def keep(self, turn: ThreadTurn, reply: Message) -> None:
        """The turn's reply arrived whole: it becomes the thread's tip (and its file)."""
        if turn.done:
            return
        turn.done = True
        held = HeldThread(
            message_id=reply.id,
            system=turn.system,
            tools=turn.tools,
            messages=[*turn.messages, reply_message(reply)],
            used_at=self._clock(),
        )
        text = held.as_json()
        held.nbytes = len(text.encode())
        with self._lock:
            if turn.continues is not None:
                self._in_flight.discard(turn.continues)
                self._forget(turn.continues, continued=True)
            if held.nbytes > self.limits.max_bytes:
                log.info(
                    "thread %s: %d bytes, over the thread budget; not kept", reply.id, held.nbytes
                )
                return
            self._held[reply.id] = held
            self._bytes += held.nbytes
            self._disk.write(held.message_id, text)
            self._evict()

    def release(self, turn: ThreadTurn) -> None:
        """The turn failed or was cancelled: its thread can be continued again."""
        if turn.done:
            return
        turn.done = True
        if turn.continues is not None:
            with self._lock:
                self._in_flight.discard(turn.continues)

    @property
    def pin_s(self) -> float:
        """How long a threaded turn's KV outranks unpinned prefixes in the cache: long enough
        for a tool loop's next turn, short of pinning a finished thread for its whole TTL."""
        return min(self.limits.ttl_s, PIN_S)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._held) + len(self._disk.index.keys() - self._held.keys())

    # --- memory -------------------------------------------------------------------------

    def _lookup(self, message_id: str) -> HeldThread | None:
        self._expire()
        held = self._held.get(message_id)
        if held is None and message_id in self._disk:
            held = self._read(message_id)
            if held is not None:
                self._held[message_id] = held
                self._bytes += held.nbytes
        if held is not None:
            self._held.move_to_end(message_id)
            self._disk.touch(message_id)
        return held

    def _expire(self) -> None:
        cutoff = self._clock() - self.limits.ttl_s
        stale = [i for i, held in self._held.items() if held.used_at < cutoff]
        for message_id in stale:
            if message_id not in self._in_flight:
                self._forget(message_id)
        self._disk.enforce(frozenset(self._in_flight))

    def _evict(self) -> None:
        """Least recently used first, until count and bytes fit (in memory; the files are
        held to the same budget by ConversationFiles)."""
        while self._held and (
            len(self._held) > self.limits.max_threads or self._bytes > self.limits.max_bytes
        ):
            oldest = next(iter(self._held))
            if oldest in self._in_flight and len(self._held) == 1:
                break
            self._forget(oldest)
        self._disk.enforce(frozenset(self._in_flight))

    def _forget(self, message_id: str, *, continued: bool = False) -> None:
        held = self._held.pop(message_id, None)
        if held is not None:
            self._bytes -= held.nbytes
        if continued:
            self._continued[message_id] = None
            while len(self._continued) > _TOMBSTONES:
                self._continued.popitem(last=False)
        self._disk.delete(message_id)

    def _read(self, message_id: str) -> HeldThread | None:
        """A thread file, if it is one this store wrote and is well-formed; else None."""
        found = self._disk.read(message_id)
        if found is None:
            return None
        held = _held_from(found[0], message_id, found[1])
        if held is None:
            log.info("threads: %s.json is no thread of this server; removed", message_id)
            self._disk.delete(message_id)
        return held


def _held_from(data: Any, message_id: str, nbytes: int) -> HeldThread | None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if data.get("message_id") != message_id:
        return None
    messages, system, tools = data.get("messages"), data.get("system"), data.get("tools")
    used_at = data.get("used_at")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    for part in (system, tools):
        if part is not None and (
            not isinstance(part, list) or not all(isinstance(p, dict) for p in part)
        ):
            return None
    if not isinstance(used_at, (int, float)):
        return None
    return HeldThread(message_id, system, tools, messages, float(used_at), nbytes)
