"""Wire types of the message-threads beta (`anthropic-beta: message-threads-2026-08-12`).

A thread is a conversation the server holds between turns: `{"type": "create"}` asks the
server to keep this request's conversation under the reply's message id, and
`{"type": "continue", "previous_message_id": ...}` sends only the new messages and lets the
server prepend what it holds. `system` and `tools` belong to the thread: a `continue` does not
repeat them. The SDKs' tool runners use threads by default, and fall back to sending the whole
history when the server answers an error whose `error.details.error_code` says why, with the
status the SDKs' error table pairs it with (`THREAD_ERRORS`: the SDK picks its error class by
status and code together, so a code under the wrong status reads as an unnamed error).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxlaunch.protocol.errors import ErrorType

THREADS_BETA = "message-threads-2026-08-12"

ThreadErrorCode = Literal[
    # The id names no conversation this server holds (never created, expired, evicted):
    # the SDKs replay the whole history under a new thread.
    "thread_not_found",
    # The reply was continued before (threads are linear, as Anthropic's are): replay.
    "thread_already_continued",
    # Its continuation is still being generated: replay.
    "thread_continue_in_flight",
    # This request cannot be threaded (`details.unsupported` names the fields): the SDKs
    # stop threading and send the full history from then on.
    "thread_unsupported_request",
]

# Each code's error type and status, as the Anthropic SDK's table has them
# (`anthropic._error_classes.ERROR_CLASSES`: (404, "thread_not_found") is ThreadNotFoundError).
THREAD_ERRORS: dict[ThreadErrorCode, tuple[ErrorType, int]] = {
    "thread_not_found": ("not_found_error", 404),
    "thread_already_continued": ("invalid_request_error", 400),
    "thread_continue_in_flight": ("invalid_request_error", 400),
    "thread_unsupported_request": ("invalid_request_error", 400),
}


class _ThreadWire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ThreadCreate(_ThreadWire):
    type: Literal["create"]


class ThreadContinue(_ThreadWire):
    type: Literal["continue"]
    previous_message_id: Annotated[str, Field(min_length=1, max_length=256)]


MessageThread = Annotated[ThreadCreate | ThreadContinue, Field(discriminator="type")]
