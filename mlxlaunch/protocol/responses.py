"""The response body of `POST /v1/messages` (non-streaming) and its parts.

The same block and usage models appear inside streaming events (see `events.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field

from mlxlaunch.protocol.context_management import (
    ContextManagementResponse,
    CountTokensContextManagement,
)
from mlxlaunch.protocol.safeguards import SafeguardResult

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]


class ResponseTextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str = ""


class ResponseThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str = ""


class ResponseToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ResponseServerToolUseBlock(BaseModel):
    """A call of a server tool (`web_search`) that the server runs, not the client."""

    type: Literal["server_tool_use"] = "server_tool_use"
    id: str  # srvtoolu_…
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


WebSearchErrorCode = Literal[
    "unavailable", "max_uses_exceeded", "too_many_requests", "invalid_tool_input", "query_too_long"
]


class WebSearchToolResultError(BaseModel):
    type: Literal["web_search_tool_result_error"] = "web_search_tool_result_error"
    error_code: WebSearchErrorCode


class WebSearchResult(BaseModel):
    """One hit of a web search; `encrypted_content` is opaque to clients (they echo it)."""

    type: Literal["web_search_result"] = "web_search_result"
    url: str
    title: str
    encrypted_content: str
    page_age: str | None = None


class ResponseWebSearchToolResultBlock(BaseModel):
    """The outcome of a `server_tool_use` web search: its results, or the tool's error."""

    type: Literal["web_search_tool_result"] = "web_search_tool_result"
    tool_use_id: str
    content: list[WebSearchResult] | WebSearchToolResultError


ResponseContentBlock = Annotated[
    ResponseTextBlock
    | ResponseThinkingBlock
    | ResponseToolUseBlock
    | ResponseServerToolUseBlock
    | ResponseWebSearchToolResultBlock,
    Discriminator("type"),
]


class ServerToolUsage(BaseModel):
    """How often the server ran its own tools for one answer."""

    web_search_requests: int = 0
    web_fetch_requests: int = 0


class Usage(BaseModel):
    """Token usage. `input_tokens` is only the uncached part of the prompt."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    # Only on an answer whose request offered a server tool (web search), as the API does.
    server_tool_use: ServerToolUsage | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class Message(BaseModel):
    """An assistant message, as returned by a non-streaming request."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ResponseContentBlock] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage = Field(default_factory=Usage)
    # Non-streaming home of the safety check's verdicts (protocol/safeguards.py); left out
    # unless the request asked for the check.
    safeguard_results: list[SafeguardResult] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    # What the request's context edits cleared; left out when it asked for none.
    context_management: ContextManagementResponse | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class CountTokensResponse(BaseModel):
    input_tokens: int
    context_management: CountTokensContextManagement | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class ModelEntry(BaseModel):
    id: str
    type: Literal["model"] = "model"
    display_name: str
    created_at: str  # RFC 3339
    # As Anthropic's Models API names them; None until the model is loaded.
    max_input_tokens: int | None = None  # the context window, prompt and output together
    max_tokens: int | None = None  # the most output one request may ask for


class ModelList(BaseModel):
    data: list[ModelEntry]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
