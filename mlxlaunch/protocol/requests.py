"""Request bodies of `POST /v1/messages` and `POST /v1/messages/count_tokens`.

Unknown fields are ignored everywhere (Claude Code adds fields every release: `cache_control`,
`defer_loading`, `context_management`, `metadata`, ...). Fields whose mistakes would change the
output are strict: `model`, `messages`, `max_tokens`, roles and the shape of each content block.
Content blocks are a discriminated union on `type`, so an unknown block type is a 400 naming it.
Emptiness follows Anthropic's rules (it answers 400 to these, so clients never rely on them):
no empty user or system turn, no empty text block in one, no whitespace-only stop sequence.
Assistant turns are the exception, anywhere in the conversation: a local model can end its
reply at once, and that empty reply comes back in the client's history on every later turn —
refusing it would wedge the session for good.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    field_validator,
    model_validator,
)

from mlxlaunch.protocol import limits
from mlxlaunch.protocol.context_management import ContextManagement
from mlxlaunch.protocol.json_schema import JsonSchema
from mlxlaunch.protocol.safeguards import Safeguards
from mlxlaunch.protocol.threads import MessageThread

StrictPositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonEmptyStr = Annotated[str, Field(strict=True, min_length=1)]
# Bounds from protocol/limits.py: far above real use, they keep hostile input cheap to refuse.
TokenCount = Annotated[int, Field(strict=True, ge=1, le=limits.MAX_OUTPUT_TOKENS)]
Name = limits.Name


class WireModel(BaseModel):
    """Base of every request model: unknown fields are accepted and dropped."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- content blocks -----------------------------------------------------------------------


class TextBlock(WireModel):
    type: Literal["text"]
    text: Annotated[str, Field(strict=True)]


class ImageBlock(WireModel):
    type: Literal["image"]
    source: dict[str, Any]


class DocumentBlock(WireModel):
    type: Literal["document"]
    source: dict[str, Any]
    title: str | None = None
    context: str | None = None


ToolResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Discriminator("type")]


def _text_to_blocks(value: Any) -> Any:
    """A plain string is shorthand for one text block; normalise so there is one shape."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    return value


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: Name
    name: Name
    input: dict[str, Any]


class ServerToolUseBlock(WireModel):
    """A server tool's call (web search) that an earlier answer made, sent back as history."""

    type: Literal["server_tool_use"]
    id: Name
    name: Name
    input: dict[str, Any] = Field(default_factory=dict)


class WebSearchResultPart(WireModel):
    type: Literal["web_search_result"]
    url: str
    title: str = ""
    encrypted_content: str = ""
    page_age: str | None = None


class WebSearchErrorPart(WireModel):
    type: Literal["web_search_tool_result_error"]
    error_code: str


class WebSearchToolResultBlock(WireModel):
    """A web search's outcome from an earlier answer, sent back as history."""

    type: Literal["web_search_tool_result"]
    tool_use_id: Name
    content: (
        Annotated[list[WebSearchResultPart], Field(max_length=limits.MAX_BLOCKS)]
        | WebSearchErrorPart
    )


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: Name
    content: Annotated[list[ToolResultPart], Field(max_length=limits.MAX_BLOCKS)] = Field(
        default_factory=list
    )
    is_error: Annotated[bool, Field(strict=True)] = False

    _normalise_content = field_validator("content", mode="before")(_text_to_blocks)


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: Annotated[str, Field(strict=True)]
    # Opaque to us; clients echo back what we sent, other servers' signatures are meaningless.
    # `exclude`: never dumped, so a stored conversation (server/threads.py) keeps only what
    # its prompt is made of, not a client's megabytes of signature.
    signature: Annotated[str, Field(exclude=True)] = ""


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    # Another server's encrypted reasoning: no prompt uses it (server/mapping.py skips the
    # block), so it is never dumped, never stored.
    data: Annotated[str, Field(strict=True, exclude=True)] = ""


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ServerToolUseBlock
    | WebSearchToolResultBlock,
    Discriminator("type"),
]


class InputMessage(WireModel):
    """One conversation turn. `system` turns are mid-conversation operator instructions."""

    role: Literal["user", "assistant", "system"]
    content: Annotated[list[ContentBlock], Field(max_length=limits.MAX_BLOCKS)]

    @field_validator("content", mode="before")
    @classmethod
    def _normalise_content(cls, value: Any) -> Any:
        # "" is no content rather than one empty text block: an empty turn gets the
        # empty-message error (and an empty assistant turn stays allowed).
        return [] if value == "" else _text_to_blocks(value)

    @model_validator(mode="after")
    def _system_turns_are_text(self) -> InputMessage:
        if self.role == "system" and any(b.type != "text" for b in self.content):
            raise ValueError("a system message may contain only text blocks")
        return self


# --- tools, thinking, output format ---------------------------------------------------------


class Tool(WireModel):
    """A client tool. Server tools (other `type`s, no schema) are accepted and not offered."""

    type: str | None = None
    name: Name
    description: str = ""
    input_schema: JsonSchema | None = None
    strict: bool = False
    # The web search tool's settings (others' are ignored).
    max_uses: Annotated[int, Field(strict=True, ge=1)] | None = None
    allowed_domains: Annotated[list[str], Field(max_length=limits.MAX_TOOLS)] | None = None
    blocked_domains: Annotated[list[str], Field(max_length=limits.MAX_TOOLS)] | None = None
    user_location: dict[str, Any] | None = None  # accepted; the backends take no location

    @property
    def is_client_tool(self) -> bool:
        return self.type in (None, "custom")

    @property
    def is_web_search(self) -> bool:
        """Anthropic's web search server tool (`web_search_20250305`, …)."""
        return self.type is not None and self.type.startswith("web_search_")

    @model_validator(mode="after")
    def _client_tools_have_schema(self) -> Tool:
        if self.is_client_tool and self.input_schema is None:
            raise ValueError("input_schema: Field required")
        if self.is_web_search and self.allowed_domains and self.blocked_domains:
            raise ValueError("allowed_domains and blocked_domains: only one of them may be given")
        return self


class ToolChoiceAuto(WireModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(WireModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(WireModel):
    type: Literal["tool"]
    name: NonEmptyStr
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(WireModel):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Discriminator("type")
]


class ThinkingEnabled(WireModel):
    type: Literal["enabled"]
    budget_tokens: TokenCount
    display: str | None = None


class ThinkingAdaptive(WireModel):
    type: Literal["adaptive"]
    display: str | None = None


class ThinkingDisabled(WireModel):
    type: Literal["disabled"]


ThinkingConfig = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Discriminator("type")
]


class JsonSchemaFormat(WireModel):
    type: Literal["json_schema"]
    # `schema` would shadow a BaseModel attribute; keep the wire name as the alias.
    json_schema: JsonSchema = Field(alias="schema")


class OutputConfig(WireModel):
    effort: str | None = None
    format: JsonSchemaFormat | None = None


# --- request bodies -----------------------------------------------------------------------


class CountTokensRequest(WireModel):
    """Body of `POST /v1/messages/count_tokens` (and the shared part of a messages request)."""

    model: NonEmptyStr
    messages: Annotated[list[InputMessage], Field(min_length=1, max_length=limits.MAX_MESSAGES)]
    system: Annotated[list[TextBlock], Field(max_length=limits.MAX_BLOCKS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=limits.MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # The structured-outputs beta spelled the same thing at the top level.
    output_format: JsonSchemaFormat | None = None
    # Edits applied before rendering (protocol/context_management.py, server/context_edits.py).
    context_management: ContextManagement | None = None

    _normalise_system = field_validator("system", mode="before")(_text_to_blocks)
    # Any plain id is served by the loaded model; a path or URL is refused (never loaded).
    _plain_model_id = field_validator("model")(limits.check_model_id)

    @model_validator(mode="after")
    def _turns_have_content(self) -> CountTokensRequest:
        # Tool results and the top-level system prompt stay lenient: refusing there is not
        # known to match Anthropic. Assistant turns too (see the module docstring).
        for index, turn in enumerate(self.messages):
            if turn.role == "assistant":
                continue
            if not turn.content:
                raise ValueError(
                    f"messages.{index}.content: all messages must have non-empty content "
                    "except for the optional final assistant message"
                )
            for position, block in enumerate(turn.content):
                if isinstance(block, TextBlock) and not block.text:
                    raise ValueError(
                        f"messages.{index}.content.{position}.text: "
                        "text content blocks must be non-empty"
                    )
        return self

    @property
    def response_format(self) -> JsonSchemaFormat | None:
        """The requested JSON-schema output format, whichever spelling the client used."""
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format
        return self.output_format


def _has_non_whitespace(stop: str) -> str:
    # Anthropic's rule; an empty stop sequence would also match at every position.
    if not stop.strip():
        raise ValueError("each stop sequence must contain non-whitespace")
    return stop


StopSequence = Annotated[
    str,
    Field(strict=True, max_length=limits.MAX_STOP_SEQUENCE_CHARS),
    AfterValidator(_has_non_whitespace),
]

# All stop sequences together: the parser compares each piece of output against every one, so
# their total length is the per-token cost (256 × 1,000 characters: ~0.6 ms a token, in a loop
# that serves every request). 64k is far above any real use (Claude Code sends none).
MAX_STOP_SEQUENCES_TOTAL_CHARS = 65_536


def _total_within_limit(stops: list[str]) -> list[str]:
    total = sum(len(stop) for stop in stops)
    if total > MAX_STOP_SEQUENCES_TOTAL_CHARS:
        raise ValueError(
            f"the stop sequences total {total} characters; at most "
            f"{MAX_STOP_SEQUENCES_TOTAL_CHARS} are allowed"
        )
    return stops


class MessagesRequest(CountTokensRequest):
    """Body of `POST /v1/messages`."""

    max_tokens: TokenCount
    stream: Annotated[bool, Field(strict=True)] = False
    stop_sequences: (
        Annotated[
            list[StopSequence],
            Field(max_length=limits.MAX_STOP_SEQUENCES),
            AfterValidator(_total_within_limit),
        ]
        | None
    ) = None
    temperature: Annotated[float, Field(strict=True, ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(strict=True, ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(strict=True, ge=0, le=limits.MAX_TOP_K)] | None = None
    # The message-threads beta (protocol/threads.py): the server holds the conversation.
    thread: MessageThread | None = None
    # Claude Code's auto-mode safety check (protocol/safeguards.py, server/safeguards.py).
    safeguards: Safeguards = None
