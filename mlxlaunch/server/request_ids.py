"""A `request-id` on every response, as Anthropic's API sends one.

The SDKs show it (`message._request_id`, error messages) and users quote it in bug reports; a
response without one reads `request_id: None`. It wraps everything else, so refusals of the
request guard (bad Host, oversized body) carry one too.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"request-id"


def new_request_id() -> str:
    """A fresh `req_…` id."""
    return "req_" + secrets.token_hex(12)


class RequestIds:
    """ASGI middleware: adds `request-id` to each HTTP response (keeps one already set)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id().encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == REQUEST_ID_HEADER for name, _ in headers):
                    headers.append((REQUEST_ID_HEADER, request_id))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
