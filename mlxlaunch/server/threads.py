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

Bounds, files and pins are the conversation store's (server/conversation_store.py, shared
with stored responses): files `msg_<24 hex>.json` beside the disk KV cache, when there is one.
A thread being continued stays, whatever the TTL and the budget.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.responses import Message
from mlxlaunch.protocol.threads import THREAD_ERRORS, ThreadContinue, ThreadErrorCode
from mlxlaunch.server.conversation_files import ThreadLimits
from mlxlaunch.server.conversation_store import ConversationStore
from mlxlaunch.server.errors import ApiError

__all__ = ["ThreadLimits", "ThreadStore", "ThreadTurn"]

FORMAT = "mlxlaunch-thread-1"
# The ids this server gives replies (server/blocks.py new_message_id) and so names files by.
_OWN_ID = re.compile(r"msg_[0-9a-f]{24}")
# Fields a thread holds; a `continue` that repeats one is refused (the SDKs never send them).
CREATE_ONLY = ("system", "tools")
# How many continued ids are remembered, to answer `thread_already_continued`.
_TOMBSTONES = 4096


@dataclass
class HeldThread:
    """One thread's tip: the whole conversation up to and including the reply `message_id`."""

    message_id: str
    system: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]

    def fields(self) -> dict[str, Any]:
        """What its file holds (after the format marker): its fields, by name."""
        return dict(vars(self))


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


class ThreadStore(ConversationStore[HeldThread]):
    """The threads one server holds, by the id of their tip."""

    format_name = FORMAT
    own_id = _OWN_ID
    what = "threads"
    noun = "thread"

    @cached_property
    def _in_flight(self) -> set[str]:
        """Threads being continued (each by one request at a time)."""
        return set()

    @cached_property
    def _continued(self) -> OrderedDict[str, None]:
        """Threads continued once (tombstones, newest last)."""
        return OrderedDict()

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
            held = self._get(previous)
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
        )
        with self._lock:
            if turn.continues is not None:
                self._in_flight.discard(turn.continues)
                self._forget(turn.continues)
                self._continued[turn.continues] = None  # to answer thread_already_continued
                while len(self._continued) > _TOMBSTONES:
                    self._continued.popitem(last=False)
            self._put(reply.id, held, held.fields())

    def release(self, turn: ThreadTurn) -> None:
        """The turn failed or was cancelled: its thread can be continued again."""
        if turn.done:
            return
        turn.done = True
        if turn.continues is not None:
            with self._lock:
                self._in_flight.discard(turn.continues)

    # --- the store's questions -------------------------------------------------------------

    def busy(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def decode(self, data: dict[str, Any], conversation_id: str) -> HeldThread | None:
        if data.get("message_id") != conversation_id:
            return None
        messages, system, tools = data.get("messages"), data.get("system"), data.get("tools")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None
        for part in (system, tools):
            if part is not None and (
                not isinstance(part, list) or not all(isinstance(p, dict) for p in part)
            ):
                return None
        if not isinstance(data.get("used_at"), (int, float)):
            return None
        return HeldThread(conversation_id, system, tools, messages)
