"""protocol room of mlxlaunch: Anthropic Messages API wire types, errors and SSE framing.

Pure pydantic; never imports mlx or starlette (see DESIGN.md).
"""

from __future__ import annotations

from mlxlaunch.protocol.errors import (
    ERROR_STATUS,
    ErrorType,
    describe_validation_error,
    error_body,
    status_for,
)
from mlxlaunch.protocol.requests import CountTokensRequest, MessagesRequest
from mlxlaunch.protocol.responses import Message, Usage
from mlxlaunch.protocol.sse import encode_event, frame, parse_frames

__all__ = [
    "ERROR_STATUS",
    "CountTokensRequest",
    "ErrorType",
    "Message",
    "MessagesRequest",
    "Usage",
    "describe_validation_error",
    "encode_event",
    "error_body",
    "frame",
    "parse_frames",
    "status_for",
]
