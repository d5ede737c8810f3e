"""Every error a client sees, as the one Anthropic envelope; engine errors through one table.

`ApiError` is raised inside handlers and becomes a response in `error_response`. An engine
error finds its answer in `ENGINE_ERRORS` (first match wins, so subclasses come first): its
error type and HTTP status, whether the client should retry, and how the log reports it.
Only an error outside the table — a bug — is logged with its traceback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from mlxlaunch.engine.types import (
    EngineError,
    EngineUnavailable,
    GenerationFailed,
    InvalidRequest,
    ModelNotServed,
    Overloaded,
)
from mlxlaunch.protocol.errors import ErrorType, error_body, status_for
from mlxlaunch.protocol.limits import shown

log = logging.getLogger("mlxlaunch.server")

MAX_ERROR_MESSAGE_CHARS = 4_000


class ApiError(Exception):
    """An error to answer with the envelope; raised inside handlers."""

    def __init__(
        self,
        error_type: ErrorType,
        message: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        # Bounded: messages quote what the client sent (an id, a type), and a 4 MB id was
        # echoed whole; nothing of ours is this long.
        message = shown(message, MAX_ERROR_MESSAGE_CHARS)
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status or status_for(error_type)
        self.headers = headers or {}
        self.details = details


def error_response(exc: ApiError) -> JSONResponse:
    """The one place an error becomes an HTTP response."""
    return JSONResponse(
        error_body(exc.error_type, exc.message, details=exc.details),
        status_code=exc.status,
        headers=exc.headers,
    )


FAILED = "generation failed: "


@dataclass(frozen=True)
class ErrorAnswer:
    """How the server answers one kind of engine error."""

    error_type: ErrorType
    status: int | None = None  # None: the error type's own (protocol/errors.py)
    prefix: str = ""  # put before the engine's message
    retry: bool = False  # retry-after and x-should-retry headers (the SDKs honour them)
    log_level: int | None = None  # None: the request's own log line says enough


ENGINE_ERRORS: tuple[tuple[type[EngineError], ErrorAnswer], ...] = (
    # The client's mistake, PromptTooLong included: clients recognise its wording, and a 400
    # is not retried (a 500 would be, for minutes).
    (InvalidRequest, ErrorAnswer("invalid_request_error")),
    # The request names a model the server neither serves nor has on disk.
    (ModelNotServed, ErrorAnswer("not_found_error")),
    # Admission control refused it: 429, back after the engine's estimate.
    (Overloaded, ErrorAnswer("rate_limit_error", retry=True)),
    # No model to serve with (it failed to load, or the engine is stopping): the server's
    # state, not a bug, so no traceback; 503 says "not now".
    (EngineUnavailable, ErrorAnswer("api_error", status=503, log_level=logging.WARNING)),
    # This request's generation failed (model forward, memory); the others go on.
    (GenerationFailed, ErrorAnswer("api_error", prefix=FAILED, log_level=logging.ERROR)),
    (EngineError, ErrorAnswer("api_error", log_level=logging.ERROR)),
)

UNEXPECTED_MESSAGE = "internal server error (the server log has the details)"


def answer_for(exc: EngineError) -> ErrorAnswer:
    """The table's answer for `exc` (the last row matches every engine error)."""
    return next(answer for kind, answer in ENGINE_ERRORS if isinstance(exc, kind))


def engine_error(exc: Exception) -> ApiError:
    """Translate an engine (or unexpected) error into the envelope's terms."""
    if isinstance(exc, ApiError):
        return exc
    if not isinstance(exc, EngineError):
        log.error("request failed: %s: %s", type(exc).__name__, shown(exc, 500), exc_info=exc)
        return ApiError("api_error", UNEXPECTED_MESSAGE)
    answer = answer_for(exc)
    message = answer.prefix + (str(exc) or type(exc).__name__)
    if answer.log_level is not None:
        log.log(answer.log_level, "request failed: %s", message)
    headers: dict[str, str] = {}
    if answer.retry:
        retry_after = exc.retry_after if isinstance(exc, Overloaded) else 1
        headers = {"retry-after": str(max(1, int(retry_after))), "x-should-retry": "true"}
    return ApiError(answer.error_type, message, status=answer.status, headers=headers)
