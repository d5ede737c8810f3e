"""Wire types of OpenAI's Chat Completions API: `POST /v1/chat/completions`, the OpenAI shape
of `GET /v1/models`, and OpenAI's error envelope.

Requests are lenient in the same way as the Anthropic ones (protocol/requests.py): unknown
fields are ignored (clients send `user`, `metadata`, `store`, `logprobs`, penalties, …), while
what would change the output is checked: `model`, `messages`, each message's role and content
parts, token counts, sampling ranges, `n` (only 1 is served). `function` and `custom`
(freeform) tools are offered; hosted tool types are accepted and not offered (the mapping
logs a note), as peers do. A custom tool's call is `{"type": "custom", "custom": {"name",
"input"}}`, in the history, the answer and (one `custom.input` piece each) the stream.

Answers are pydantic models too, dumped as the OpenAI SDK reads them: `content: null` and
`finish_reason: null` where OpenAI sends them, absent fields absent in stream deltas.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from mlxlaunch.protocol import limits
from mlxlaunch.protocol.json_schema import JsonSchema
from mlxlaunch.protocol.requests import (
    MAX_STOP_SEQUENCES_TOTAL_CHARS,
    Name,
    NonEmptyStr,
    TokenCount,
    WireModel,
)
from mlxlaunch.protocol.responses import ModelEntry

StrictStr = Annotated[str, Field(strict=True)]

# --- content parts ---------------------------------------------------------------------------


class TextPart(WireModel):
    type: Literal["text"]
    text: StrictStr


class ImageUrlPart(WireModel):
    type: Literal["image_url"]
    image_url: dict[str, Any]


class AudioPart(WireModel):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class FilePart(WireModel):
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(WireModel):
    type: Literal["refusal"]
    refusal: StrictStr


UserPart = Annotated[TextPart | ImageUrlPart | AudioPart | FilePart, Discriminator("type")]
AssistantPart = Annotated[TextPart | RefusalPart, Discriminator("type")]
Parts = Annotated[list[TextPart], Field(max_length=limits.MAX_BLOCKS)]

# --- messages --------------------------------------------------------------------------------


class FunctionCall(WireModel):
    name: Name
    arguments: StrictStr = ""  # JSON text of the arguments object, as the model wrote it


class OfItsType(WireModel):
    """A wire object whose `type` ("function" or "custom") names the field that must hold
    its definition (other types hold none)."""

    type: str

    @model_validator(mode="after")
    def _has_its_kind(self) -> OfItsType:
        if self.type in ("function", "custom") and getattr(self, self.type, None) is None:
            raise ValueError(f"{self.type}: Field required")
        return self


class CustomCall(WireModel):
    name: Name
    input: StrictStr


class ToolCall(OfItsType):
    """A call of the assistant's: a function's (`function`) or a custom tool's (`custom`)."""

    id: Name
    type: Literal["function", "custom"] = "function"
    function: FunctionCall | None = None
    custom: CustomCall | None = None


class SystemMessage(WireModel):
    """`system`, or `developer` (what newer OpenAI models call it): operator instructions."""

    role: Literal["system", "developer"]
    content: StrictStr | Parts


class UserMessage(WireModel):
    role: Literal["user"]
    content: StrictStr | Annotated[list[UserPart], Field(max_length=limits.MAX_BLOCKS)]


class AssistantMessage(WireModel):
    """A turn of the model: text, calls, and the reasoning peers return beside the text
    (`reasoning_content` as vLLM and LM Studio name it, `reasoning` as Ollama does)."""

    role: Literal["assistant"]
    content: (
        StrictStr | Annotated[list[AssistantPart], Field(max_length=limits.MAX_BLOCKS)] | None
    ) = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=limits.MAX_BLOCKS)] | None = None
    reasoning_content: StrictStr | None = None
    reasoning: StrictStr | None = None


class ToolMessage(WireModel):
    """The result of the call `tool_call_id` of the previous assistant message."""

    role: Literal["tool"]
    tool_call_id: Name
    # Text parts by OpenAI's spec; image parts too, as clients that pass a tool's picture
    # on send them (a text-only model reads a placeholder instead).
    content: StrictStr | Annotated[list[UserPart], Field(max_length=limits.MAX_BLOCKS)]


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Discriminator("role")
]

# --- tools, tool choice, output format -------------------------------------------------------


class FunctionDefinition(WireModel):
    name: Name
    description: str = ""
    parameters: JsonSchema | None = None  # OpenAI: omitted means no arguments
    strict: bool | None = None


class GrammarDefinition(WireModel):
    definition: StrictStr
    syntax: Literal["lark", "regex"]


class GrammarFormat(WireModel):
    type: Literal["grammar"]
    grammar: GrammarDefinition


class FreeTextFormat(WireModel):
    type: Literal["text"]


class CustomDefinition(WireModel):
    """A freeform tool: called with raw text (its grammar's, when it has one)."""

    name: Name
    description: str = ""
    format: Annotated[GrammarFormat | FreeTextFormat, Field(discriminator="type")] | None = None


class ChatTool(OfItsType):
    """A tool. `function` and `custom` tools are offered; other types (hosted tools) are
    accepted and ignored."""

    type: NonEmptyStr
    function: FunctionDefinition | None = None
    custom: CustomDefinition | None = None

    @property
    def is_function(self) -> bool:
        return self.type == "function"


class NamedFunction(WireModel):
    name: NonEmptyStr


class NamedToolChoice(OfItsType):
    """A named tool: `{"type": "function", "function": {"name"}}`, or a custom tool's
    `{"type": "custom", "custom": {"name"}}`."""

    type: Literal["function", "custom"]
    function: NamedFunction | None = None
    custom: NamedFunction | None = None

    @property
    def name(self) -> str:
        named = self.function if self.type == "function" else self.custom
        assert named is not None
        return named.name


ToolChoiceOption = Literal["none", "auto", "required"] | NamedToolChoice


class TextFormat(WireModel):
    type: Literal["text"]


class JsonObjectFormat(WireModel):
    type: Literal["json_object"]


class JsonSchemaSpec(WireModel):
    name: str = ""
    description: str | None = None
    # `schema` would shadow a BaseModel attribute; keep the wire name as the alias.
    json_schema: JsonSchema | None = Field(default=None, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Discriminator("type")]


class StreamOptions(WireModel):
    include_usage: bool = False


# --- the request -----------------------------------------------------------------------------


def _stop_list(value: Any) -> Any:
    """`stop` is a string or a list of them; one shape, without empty strings (an empty stop
    sequence would match at every position)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [stop for stop in value if stop != ""]
    return value


StopSequence = Annotated[str, Field(strict=True, max_length=limits.MAX_STOP_SEQUENCE_CHARS)]


class ChatCompletionRequest(WireModel):
    """Body of `POST /v1/chat/completions`."""

    model: NonEmptyStr
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=limits.MAX_MESSAGES)]
    tools: Annotated[list[ChatTool], Field(max_length=limits.MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceOption | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # `max_tokens` is the older name; `max_completion_tokens` wins when both are set.
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(strict=True, ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(strict=True, ge=0.0, le=1.0)] | None = None
    # Sampling extensions vLLM and llama.cpp accept under these names.
    top_k: Annotated[int, Field(strict=True, ge=0, le=limits.MAX_TOP_K)] | None = None
    min_p: Annotated[float, Field(strict=True, ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(strict=True, gt=0.0, le=10.0)] | None = None
    stop: Annotated[list[StopSequence], Field(max_length=limits.MAX_STOP_SEQUENCES)] | None = None
    seed: Annotated[int, Field(strict=True, ge=-(1 << 63), lt=1 << 64)] | None = None
    n: Annotated[int, Field(strict=True)] | None = None
    stream: Annotated[bool, Field(strict=True)] = False
    stream_options: StreamOptions | None = None
    reasoning_effort: str | None = None
    # vLLM's way to switch a template's thinking (`{"enable_thinking": false}`), which
    # opencode and others send to Qwen3-style models; only that key is read.
    chat_template_kwargs: dict[str, Any] | None = None

    _plain_model_id = field_validator("model")(limits.check_model_id)
    _normalise_stop = field_validator("stop", mode="before")(_stop_list)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"only n=1 is supported (got {value}): one choice per request")
        return value

    @field_validator("stop")
    @classmethod
    def _stops_within_limit(cls, stops: list[str] | None) -> list[str] | None:
        total = sum(len(stop) for stop in stops or [])
        if total > MAX_STOP_SEQUENCES_TOTAL_CHARS:
            raise ValueError(
                f"the stop sequences total {total} characters; at most "
                f"{MAX_STOP_SEQUENCES_TOTAL_CHARS} are allowed"
            )
        return stops

    @property
    def output_limit(self) -> int | None:
        """The output cap the client asked for, under either name (None: not set)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# --- answers ---------------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class CustomCallOut(BaseModel):
    name: str
    input: str  # the raw text the model wrote


class ToolCallOut(BaseModel):
    """A call: a function's, or a custom tool's (`type` "custom", `custom` set)."""

    id: str
    type: Literal["function", "custom"] = "function"
    function: FunctionCallOut | None = Field(default=None, exclude_if=lambda v: v is None)
    custom: CustomCallOut | None = Field(default=None, exclude_if=lambda v: v is None)


class AssistantOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=lambda v: v is None)
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Choice(BaseModel):
    index: int = 0
    message: AssistantOut
    logprobs: None = None
    finish_reason: FinishReason | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    """`prompt_tokens` is the whole prompt; the part read from the prefix cache is
    `prompt_tokens_details.cached_tokens` (OpenAI counts cached tokens inside the prompt)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class CustomDelta(BaseModel):
    name: str | None = None
    input: str | None = None


class ToolCallDelta(BaseModel):
    """One call's piece: `id`, `type` and the name come once, with the call's first piece;
    a custom tool's call streams its raw input under `custom`."""

    index: int
    id: str | None = None
    type: Literal["function", "custom"] | None = None
    function: FunctionDelta | None = None
    custom: CustomDelta | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta = Field(default_factory=ChoiceDelta)
    logprobs: None = None
    finish_reason: FinishReason | None = None

    @field_serializer("delta")
    def _present_fields_only(self, delta: ChoiceDelta) -> dict[str, Any]:
        return delta.model_dump(exclude_none=True)


class ChatCompletionChunk(BaseModel):
    """One `data:` line of a stream. The usage chunk (`stream_options.include_usage`) has no
    choices; every other chunk has `usage: null`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: CompletionUsage | None = None


# --- models ----------------------------------------------------------------------------------


class OpenAIModel(BaseModel):
    """A model in the OpenAI shape. The window rides along under Anthropic's names (as
    `ModelEntry` has them): a client that reads it (`mlx launch … --print-env --url`) finds
    it whichever shape it was answered in."""

    id: str
    object: Literal["model"] = "model"
    created: int  # Unix seconds
    owned_by: str = "mlxlaunch"
    max_input_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)
    max_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)

    @classmethod
    def from_entry(cls, entry: ModelEntry) -> OpenAIModel:
        """The same model as `entry` (the Anthropic shape), in the OpenAI shape."""
        created = int(datetime.fromisoformat(entry.created_at).timestamp())
        return cls(
            id=entry.id,
            created=created,
            max_input_tokens=entry.max_input_tokens,
            max_tokens=entry.max_tokens,
        )


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


# --- errors ----------------------------------------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: what the OpenAI SDKs parse."""

    error: OpenAIErrorDetail
