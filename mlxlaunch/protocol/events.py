"""Server-sent events of a streaming `POST /v1/messages` response.

Order (see PROTOCOL.md): message_start → per block: content_block_start, deltas,
content_block_stop → message_delta → message_stop; `ping` anywhere; `error` ends a broken stream.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Discriminator, Field

from mlxlaunch.protocol.context_management import ContextManagementResponse
from mlxlaunch.protocol.errors import ErrorDetail
from mlxlaunch.protocol.responses import Message, ResponseContentBlock, StopReason, Usage
from mlxlaunch.protocol.safeguards import SafeguardResult


class TextDeltaPart(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJsonDeltaPart(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ThinkingDeltaPart(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDeltaPart(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


BlockDelta = Annotated[
    TextDeltaPart | InputJsonDeltaPart | ThinkingDeltaPart | SignatureDeltaPart,
    Discriminator("type"),
]


class MessageStartEvent(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: Message


class ContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ResponseContentBlock


class ContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: BlockDelta


class ContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(BaseModel):
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    # The safety check's verdicts (protocol/safeguards.py); left out unless asked for.
    safeguard_results: list[SafeguardResult] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class MessageDeltaEvent(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: Usage  # cumulative totals
    # Streaming home of what the context edits cleared (beside `delta`, as the SDK reads it).
    context_management: ContextManagementResponse | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class MessageStopEvent(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class PingEvent(BaseModel):
    type: Literal["ping"] = "ping"


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


# The events that build the message, in the order above (a stream adds pings and errors).
MessageEvent = (
    MessageStartEvent
    | ContentBlockStartEvent
    | ContentBlockDeltaEvent
    | ContentBlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
)

StreamEvent = Annotated[MessageEvent | PingEvent | ErrorEvent, Discriminator("type")]
