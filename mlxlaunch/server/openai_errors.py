"""OpenAI's error envelope for the OpenAI-API endpoints (Chat Completions, Responses).

Handlers raise the same `ApiError` as the Anthropic routes; here it becomes
`{"error": {"message", "type", "param", "code"}}`, what the OpenAI SDKs and Codex parse, with
the same HTTP status. `details` of an `ApiError` may carry the `param` and `code`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxlaunch.engine.types import PromptTooLong
from mlxlaunch.protocol.openai_chat import OpenAIErrorDetail, OpenAIErrorResponse
from mlxlaunch.server.errors import ApiError, engine_error

Handler = Callable[[Request], Awaitable[Response]]

# Anthropic error type (what ApiError carries) → OpenAI (type, code).
_OPENAI_ERRORS: dict[str, tuple[str, str | None]] = {
    "invalid_request_error": ("invalid_request_error", None),
    "authentication_error": ("invalid_request_error", "invalid_api_key"),
    "permission_error": ("invalid_request_error", "permission_denied"),
    "not_found_error": ("invalid_request_error", "not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "api_error": ("server_error", None),
    "timeout_error": ("server_error", "timeout"),
    "overloaded_error": ("server_error", "server_is_overloaded"),
}


def openai_detail(error: ApiError) -> OpenAIErrorDetail:
    """The OpenAI `error` object for an `ApiError`."""
    kind, code = _OPENAI_ERRORS.get(error.error_type, ("server_error", None))
    details = error.details or {}
    return OpenAIErrorDetail(
        message=error.message,
        type=kind,
        param=details.get("param"),
        code=details.get("code", code),
    )


def openai_error(error: ApiError) -> OpenAIErrorResponse:
    return OpenAIErrorResponse(error=openai_detail(error))


def openai_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        openai_error(error).model_dump(), status_code=error.status, headers=error.headers
    )


def openai_engine_error(exc: Exception, *, param: str = "messages") -> ApiError:
    """An engine (or any) error as an ApiError; a prompt too long gets OpenAI's
    `context_length_exceeded` (clients compact on it)."""
    error = engine_error(exc)
    if isinstance(exc, PromptTooLong):
        error.details = {"param": param, "code": "context_length_exceeded"}
    return error


def in_openai_envelope(endpoint: Handler) -> Handler:
    """`endpoint`, with an error answered in Anthropic's envelope (the shared auth guard's
    401) rewritten into OpenAI's; the handlers' own errors already are."""

    async def wrapped(request: Request) -> Response:
        response = await endpoint(request)
        if response.status_code < 400 or not isinstance(response, JSONResponse):
            return response
        try:
            body = json.loads(bytes(response.body))
        except ValueError:
            return response
        if not (isinstance(body, dict) and body.get("type") == "error"):
            return response  # already OpenAI's
        detail = body.get("error") or {}
        error = ApiError(
            detail.get("type", "api_error"),
            str(detail.get("message", "")),
            status=response.status_code,
        )
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        rewritten = openai_error_response(error)
        rewritten.headers.update({k: v for k, v in headers.items() if k not in rewritten.headers})
        return rewritten

    return wrapped
