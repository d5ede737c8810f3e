"""The HTTP app (Starlette), built from the server's settings and one engine.

Each API has its handlers in its own module — Anthropic Messages (messages.py), OpenAI Chat
Completions (chat_completions.py) and Responses (responses.py), the model listing and health
(model_routes.py), stats and metrics (stats_routes.py) — all over the same engine request
(one render path, one output parser, one prefix cache) and the one drive loop
(streaming.py). Here they are put behind the auth guard (auth.py) and the request guards
(guards.py). Every error a client can see, including 404/405 and unexpected failures, is an
error envelope; bad input never takes the server down.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from mlxlaunch.server.auth import guarded
from mlxlaunch.server.chat_completions import chat_routes
from mlxlaunch.server.errors import ApiError, error_response
from mlxlaunch.server.guards import RequestGuard
from mlxlaunch.server.messages import messages_routes
from mlxlaunch.server.model_routes import model_routes
from mlxlaunch.server.request_ids import RequestIds
from mlxlaunch.server.responses import responses_routes
from mlxlaunch.server.settings import ServerSettings, ServingEngine
from mlxlaunch.server.stats_routes import stats_routes

# Where the rest of the project has always found them (the settings live in a leaf module).
__all__ = ["ServerSettings", "ServingEngine", "build_app"]


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error = ApiError("not_found_error", f"not found: {request.method} {request.url.path}")
    elif exc.status_code == 405:
        error = ApiError(
            "invalid_request_error",
            f"method {request.method} not allowed for {request.url.path}",
            status=405,
            headers=dict(exc.headers or {}),
        )
    else:
        error = ApiError("api_error", str(exc.detail), status=exc.status_code)
    return error_response(error)


async def _unexpected(request: Request, exc: Exception) -> Response:
    return error_response(ApiError("api_error", "internal server error"))


def build_app(engine: ServingEngine, settings: ServerSettings | None = None) -> Starlette:
    """The Starlette app serving `engine` under the Anthropic and OpenAI APIs."""
    settings = settings or ServerSettings()
    guard = partial(guarded, token=settings.auth_token)
    open_guard = partial(guarded, token=None)
    routes = [
        *messages_routes(engine, settings, guard),
        *model_routes(engine, settings.model_id, guard, open_guard),
        *stats_routes(
            engine, guard, model_id=settings.model_id, excerpts=settings.stats_prompt_excerpts
        ),
        *chat_routes(engine, settings, guard),
        *responses_routes(engine, settings, guard),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: _http_exception,
        Exception: _unexpected,
    }
    request_guard = Middleware(
        RequestGuard,
        host=settings.host,
        allowed_origins=settings.allowed_origins,
        limits=settings.limits,
    )
    ids = Middleware(RequestIds)  # outermost: the guard's refusals carry one too
    return Starlette(routes=routes, exception_handlers=handlers, middleware=[ids, request_guard])
