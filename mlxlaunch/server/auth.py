"""The guard every route runs behind: the token check, and one error envelope whatever fails.

A handler raises `ApiError` (or anything: a bug); `guarded` answers it in Anthropic's
envelope with the status server/errors.py's table gives, and logs a refusal once. The
OpenAI routes wrap the guarded handler in `in_openai_envelope` (server/openai_errors.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from mlxlaunch.server.errors import ApiError, engine_error, error_response
from mlxlaunch.server.request_log import log_refusal

Handler = Callable[[Request], Awaitable[Response]]
# What each API's routes are wrapped in (`guarded` bound to the server's settings).
Guard = Callable[[Handler], Handler]


def token_matches(request: Request, token: str) -> bool:
    """Whether the request presents `token`, as `Authorization: Bearer` or `x-api-key`."""
    presented: list[str] = []
    authorization = request.headers.get("authorization", "")
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() == "bearer" and credential:
        presented.append(credential.strip())
    if api_key := request.headers.get("x-api-key"):
        presented.append(api_key.strip())
    expected = token.encode()
    # Evaluate every candidate (no short-circuit) so timing does not tell which one failed.
    matches = [hmac.compare_digest(p.encode(), expected) for p in presented]
    return any(matches)


def guarded(handler: Handler, token: str | None, *, auth: bool = True) -> Handler:
    """Wrap a handler with the check for `token` (None: no auth) and the one error envelope."""

    async def endpoint(request: Request) -> Response:
        try:
            if auth and token and not token_matches(request, token):
                raise ApiError("authentication_error", "invalid or missing API key")
            return await handler(request)
        except Exception as exc:  # never let a bug become a non-envelope 500 or a crash
            # Every refusal gets one log line, so a client's rejected request shows in the
            # server log (a Claude Code release adding a field we refuse).
            error = engine_error(exc)
            log_refusal(request, error)
            return error_response(error)

    return endpoint
