"""Stored responses, for `previous_response_id`: a continuation sends only what is new.

A request with `store` (OpenAI's default; Codex sends `false` and resends its history) has its
whole input and its output kept under the response id, as input items the next request would
send. A request naming `previous_response_id` gets those items before its own; an id the
store does not hold is a 400 `previous_response_not_found`. Unlike message threads, a stored
response can be continued any number of times (OpenAI's responses branch).

Bounds, files and pins are the conversation store's (server/conversation_store.py, shared
with message threads): files `responses/resp_<24 hex>.json` beside the disk KV cache, when
there is one.
"""

from __future__ import annotations

import re
from typing import Any

from mlxlaunch.server.conversation_store import ConversationStore

Items = list[dict[str, Any]]


class ResponseStore(ConversationStore[Items]):
    """The responses one server holds, by response id."""

    format_name = "mlxlaunch-response-1"
    own_id = re.compile(r"resp_[0-9a-f]{24}")
    what = "responses"
    noun = "response"

    def lookup(self, response_id: str) -> Items | None:
        """The input items of the conversation ending with `response_id`, or None."""
        with self._lock:
            items = self._get(response_id)
            return None if items is None else list(items)

    def keep(self, response_id: str, items: Items) -> None:
        """Hold `items` (the whole conversation, the response's output included)."""
        with self._lock:
            self._put(response_id, items, {"id": response_id, "items": items})

    def decode(self, data: dict[str, Any], conversation_id: str) -> Items | None:
        items = data.get("items")
        if data.get("id") != conversation_id or not isinstance(items, list):
            return None
        return items if all(isinstance(i, dict) for i in items) else None
