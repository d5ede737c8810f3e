"""A request body as a validated wire model, or the 400 that says what is wrong with it.

Shared by every API's handlers (Messages, Chat Completions, Responses): each validates the
object against its own wire types; Chat Completions words field errors its own way (OpenAI's
`param`), the others name the field as protocol/errors.py does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from mlxlaunch.protocol.errors import describe_validation_error
from mlxlaunch.protocol.limits import LARGE_BODY_BYTES, RequestLimitError, load_request_json
from mlxlaunch.server.errors import ApiError

ModelT = TypeVar("ModelT", bound=BaseModel)
# How a validation error becomes the 400 (the default names the field in the message).
Describe = Callable[[ValidationError, Any], ApiError]


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


def field_error(exc: ValidationError, raw: Any) -> ApiError:
    """The 400 naming the offending fields (protocol/errors.py's wording)."""
    return ApiError("invalid_request_error", describe_validation_error(exc, raw))


async def parse_body(
    request: Request, model: type[ModelT], describe: Describe = field_error
) -> ModelT:
    """Read and validate a JSON body; any problem is a 400 naming the field."""
    raw = await request.body()
    if len(raw) > LARGE_BODY_BYTES:  # parsed in pieces off the loop: /health stays live
        return await asyncio.to_thread(partial(validate_body, raw, model, describe))
    return validate_body(raw, model, describe)


def validate_body(
    raw_bytes: bytes, model: type[ModelT], describe: Describe = field_error
) -> ModelT:
    """Parse and validate `raw_bytes` as `model`, or raise the 400 `describe` words."""
    raw = json_object(raw_bytes)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise describe(exc, raw) from exc
