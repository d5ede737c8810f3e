"""A request body as a JSON object, or the 400 that says what is wrong with it.

Shared by every API's handlers (Messages, Chat Completions, Responses): each validates the
object against its own wire types and words field errors its own way.
"""

from __future__ import annotations

import json
from typing import Any

from mlxlaunch.protocol.limits import RequestLimitError, load_request_json
from mlxlaunch.server.errors import ApiError


def json_object(raw_bytes: bytes) -> dict[str, Any]:
    """The body parsed (with the request limits: depth, huge integers, piecewise when large),
    or an `invalid_request_error` ApiError."""
    try:
        raw = load_request_json(raw_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError("invalid_request_error", f"request body is not valid JSON: {exc}") from exc
    except RequestLimitError as exc:
        raise ApiError("invalid_request_error", str(exc)) from exc
    if not isinstance(raw, dict):
        raise ApiError("invalid_request_error", "request body must be a JSON object")
    return raw
