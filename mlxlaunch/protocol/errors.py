"""The Anthropic error envelope, the error-type ↔ HTTP status table, and readable
validation messages that name the offending field path."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, ValidationError, model_serializer

from mlxlaunch.protocol.limits import shown

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "timeout_error",
    "overloaded_error",
]

ERROR_STATUS: dict[ErrorType, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class ErrorDetail(BaseModel):
    type: ErrorType
    message: str
    # Machine-readable particulars some errors carry (the threads beta's `error_code`);
    # absent from the wire when there are none.
    details: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_empty_details(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("details") is None:
            data.pop("details", None)
        return data


class ErrorResponse(BaseModel):
    """`{"type": "error", "error": {"type", "message"}}` (+ optional `request_id`)."""

    type: Literal["error"] = "error"
    error: ErrorDetail
    request_id: str | None = None


def error_body(
    error_type: ErrorType,
    message: str,
    request_id: str | None = None,
    *,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-ready error envelope."""
    envelope = ErrorResponse(
        error=ErrorDetail(type=error_type, message=message, details=details),
        request_id=request_id,
    )
    return envelope.model_dump(exclude_none=True)


def status_for(error_type: ErrorType) -> int:
    """The HTTP status that goes with an error type."""
    return ERROR_STATUS[error_type]


_MAX_REPORTED_ERRORS = 3


def describe_validation_error(exc: ValidationError, raw: Any) -> str:
    """One line naming each offending field path, e.g.
    `messages.0.content.1.tool_use_id: Field required`.

    `raw` is the input that was validated; it lets us drop the discriminator tags pydantic
    puts into error locations (`content.1.tool_result.tool_use_id`), which are not wire paths.
    """
    parts: list[str] = []
    for error in exc.errors(include_url=False)[:_MAX_REPORTED_ERRORS]:
        # Shown shortened: paths hold the client's keys, messages its values (a 22 MB `type`).
        path = shown(wire_path(error["loc"], raw), 200)
        message = shown(str(error["msg"]).removeprefix("Value error, "), 300)
        if error["type"] == "union_tag_not_found":
            path, message = f"{path}.type" if path else "type", "Field required"
        elif error["type"] == "union_tag_invalid":
            tag = shown(repr(error.get("ctx", {}).get("tag", "")))
            message = f"unknown type {tag} ({message})"
        parts.append(f"{path}: {message}" if path else message)
    remaining = exc.error_count() - len(parts)
    if remaining > 0:
        parts.append(f"and {remaining} more error(s)")
    return "; ".join(parts)


def wire_path(loc: tuple[int | str, ...], raw: Any) -> str:
    """Join a pydantic error location into a dotted wire path, skipping union tags."""
    names: list[str] = []
    node: Any = raw
    for position, step in enumerate(loc):
        following = loc[position + 1] if position + 1 < len(loc) else None
        # A step naming the block's own type is a discriminator tag, not a field, unless it is
        # also a key the location goes no further into: `{"type": "text", "text": ""}` gives
        # `content.1.text.text` (tag then field) but `system.0.text` (field only).
        is_tag = (
            isinstance(node, dict)
            and node.get("type") == step
            and (step not in node or following in node)
        )
        if is_tag:
            continue
        names.append(str(step))
        if isinstance(node, dict) and isinstance(step, str):
            node = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
        elif isinstance(node, str) and step == 0:
            node = {"type": "text", "text": node}  # string shorthand for one text block
        else:
            node = None
    return ".".join(names)
