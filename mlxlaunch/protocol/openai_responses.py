"""Wire types of OpenAI's Responses API (`POST /v1/responses`), what Codex CLI speaks.

Requests are lenient as Codex needs: unknown fields, input-item types and tool types
(`local_shell`, …) are accepted and dropped by the mapping with a log note; what would change
the output if misread is strict (roles, a function call's `call_id`/`name`/`arguments`, a
function call output's `call_id`). A `namespace` tool (Codex 0.171 puts its sub-agent tools
in one) holds function tools, served flattened. The hosted `web_search` tool is served
(server/web_search.py); a `custom` tool's call is a `custom_tool_call` with raw text.

Responses, output items, usage, stream events and the error envelope are the shapes the
official SDK and Codex read; every stream event carries `type` and `sequence_number`.

Why over 600 lines: one API's whole wire, flat declarations with no logic, whose
discriminated unions name members from every part: split, the halves would import each other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from mlxlaunch.protocol import limits
from mlxlaunch.protocol.json_schema import JsonSchema


class ResponsesWire(BaseModel):
    """Base of every request model: unknown fields are accepted and dropped."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


def _tag(known: tuple[str, ...], default: str) -> Any:
    """A discriminator that sends any unknown (or missing) `type` to the `default` member."""

    def choose(value: Any) -> str:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return kind if kind in known else default

    return Discriminator(choose)


# --- content parts ------------------------------------------------------------------------


class InputText(ResponsesWire):
    type: Literal["input_text"]
    text: Annotated[str, Field(strict=True)]


class OutputText(ResponsesWire):
    type: Literal["output_text"]
    text: Annotated[str, Field(strict=True)]


class Refusal(ResponsesWire):
    type: Literal["refusal"]
    refusal: str = ""


class InputImage(ResponsesWire):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None


class OtherPart(ResponsesWire):
    """A part of a type this server does not read (`input_file`, `input_audio`, …)."""

    type: str = ""


ContentPart = Annotated[
    Annotated[InputText, Tag("input_text")]
    | Annotated[OutputText, Tag("output_text")]
    | Annotated[Refusal, Tag("refusal")]
    | Annotated[InputImage, Tag("input_image")]
    | Annotated[OtherPart, Tag("other")],
    _tag(("input_text", "output_text", "refusal", "input_image"), "other"),
]


# --- input items --------------------------------------------------------------------------

MessageRole = Literal["user", "assistant", "system", "developer"]


class MessageItem(ResponsesWire):
    """A message; `type` may be left out (the "easy" input message)."""

    type: Literal["message"] = "message"
    role: MessageRole
    content: str | Annotated[list[ContentPart], Field(max_length=limits.MAX_BLOCKS)]
    id: str | None = None


class FunctionCallItem(ResponsesWire):
    """A call the model made, sent back in the history."""

    type: Literal["function_call"]
    call_id: limits.Name
    name: limits.Name
    arguments: Annotated[str, Field(strict=True)]
    # Codex names a call of a namespace tool by `name` and `namespace` apart.
    namespace: str | None = None
    id: str | None = None


class FunctionCallOutputItem(ResponsesWire):
    type: Literal["function_call_output"]
    call_id: limits.Name
    output: str | list[ContentPart]


class SummaryText(ResponsesWire):
    type: str = "summary_text"
    text: str = ""


class ReasoningItem(ResponsesWire):
    """An earlier turn's reasoning: its text, or what we sealed (server/sealed_reasoning.py)."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[SummaryText] | None = None
    # Never dumped: a stored turn keeps its reasoning as text (server/response_store.py).
    encrypted_content: Annotated[str | None, Field(exclude=True)] = None
    id: str | None = None


class CustomToolCallItem(ResponsesWire):
    """A call of a freeform `custom` tool (Codex's `apply_patch`), sent back in the history:
    its input is raw text, which the model sees as the call's one string argument."""

    type: Literal["custom_tool_call"]
    call_id: limits.Name
    name: limits.Name
    input: Annotated[str, Field(strict=True)]
    id: str | None = None


class CustomToolCallOutputItem(ResponsesWire):
    type: Literal["custom_tool_call_output"]
    call_id: limits.Name
    output: str | list[ContentPart]


class LocalShellAction(ResponsesWire):
    """What a `local_shell` call ran: the argv, and where and how long."""

    type: str = "exec"
    command: Annotated[list[str], Field(max_length=limits.MAX_BLOCKS)]
    working_directory: str | None = None
    timeout_ms: int | None = None


class LocalShellCallItem(ResponsesWire):
    """A call of the built-in `local_shell` tool, sent back in the history (Codex's older
    shell tool): the model sees it as a call of a `shell` tool."""

    type: Literal["local_shell_call"]
    call_id: limits.Name | None = None  # Codex may leave it out: `id` names the call then
    id: limits.Name | None = None
    action: LocalShellAction

    @model_validator(mode="after")
    def _named(self) -> LocalShellCallItem:
        if self.call_id is None and self.id is None:
            raise ValueError("a local_shell_call needs a call_id or an id")
        return self


class LocalShellCallOutputItem(ResponsesWire):
    """What a `local_shell_call` printed; `id` is the call's (OpenAI's form), or `call_id`."""

    type: Literal["local_shell_call_output"]
    call_id: limits.Name | None = None
    id: limits.Name | None = None
    output: str

    @model_validator(mode="after")
    def _named(self) -> LocalShellCallOutputItem:
        if self.call_id is None and self.id is None:
            raise ValueError("a local_shell_call_output needs the call's id or call_id")
        return self


class OtherItem(ResponsesWire):
    """An item of a type this server does not serve (`item_reference`, `web_search_call`, …)."""

    type: str = ""


InputItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | LocalShellCallItem
    | LocalShellCallOutputItem
    | OtherItem
)


def _item_kind(value: Any) -> str:
    if isinstance(value, dict) and "type" not in value and "role" in value:
        return "message"  # the easy form: {"role": ..., "content": ...}
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    known = (
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
    )
    return kind if kind in known else "other"


InputItemOrEasy = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[LocalShellCallItem, Tag("local_shell_call")]
    | Annotated[LocalShellCallOutputItem, Tag("local_shell_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


# --- tools --------------------------------------------------------------------------------


class FunctionTool(ResponsesWire):
    type: Literal["function"]
    name: limits.Name
    description: str | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None


class GrammarInputFormat(ResponsesWire):
    """A custom tool's input follows this grammar: Lark rules or one regular expression."""

    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: Annotated[str, Field(strict=True)]


class TextInputFormat(ResponsesWire):
    """A custom tool's input is free text."""

    type: Literal["text"]


CustomToolFormat = Annotated[GrammarInputFormat | TextInputFormat, Field(discriminator="type")]


class CustomTool(ResponsesWire):
    """A freeform tool (Codex's `apply_patch`): called with raw text, not JSON arguments."""

    type: Literal["custom"]
    name: limits.Name
    description: str | None = None
    format: CustomToolFormat | None = None


class OtherTool(ResponsesWire):
    """A hosted tool (`local_shell`, …): not served."""

    type: str = ""


# The hosted web search tool's spellings (run by this server: server/web_search.py).
WEB_SEARCH_TOOL_TYPES = (
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
)


class WebSearchFilters(ResponsesWire):
    allowed_domains: Annotated[list[str], Field(max_length=limits.MAX_TOOLS)] | None = None


class WebSearchTool(ResponsesWire):
    """The hosted web search tool; `search_context_size` and `user_location` are accepted."""

    type: str
    filters: WebSearchFilters | None = None
    search_context_size: str | None = None
    user_location: dict[str, Any] | None = None


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in WEB_SEARCH_TOOL_TYPES:
        return "web_search"
    return kind if kind in ("function", "namespace", "custom") else "other"


NamespaceMember = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")],
    _tag(("function",), "other"),
]


class NamespaceTool(ResponsesWire):
    """Function tools grouped under a name; calls name them by `namespace` and `name`."""

    type: Literal["namespace"]
    name: limits.NameOrEmpty
    description: str | None = None
    tools: Annotated[list[NamespaceMember], Field(max_length=limits.MAX_TOOLS)] = Field(
        default_factory=list
    )


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[WebSearchTool, Tag("web_search")]
    | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_kind),
]


class ToolChoiceFunction(ResponsesWire):
    type: Literal["function"]
    name: limits.NameOrEmpty


class ToolChoiceCustom(ResponsesWire):
    type: Literal["custom"]
    name: limits.NameOrEmpty


class ToolChoiceOther(ResponsesWire):
    """`allowed_tools`, a hosted tool type, …: served as `auto`."""

    type: str = ""


ToolChoiceObject = Annotated[
    Annotated[ToolChoiceFunction, Tag("function")]
    | Annotated[ToolChoiceCustom, Tag("custom")]
    | Annotated[ToolChoiceOther, Tag("other")],
    _tag(("function", "custom"), "other"),
]


# --- text format, reasoning ---------------------------------------------------------------


class JsonSchemaTextFormat(ResponsesWire):
    type: Literal["json_schema"]
    name: str | None = None
    json_schema: JsonSchema = Field(alias="schema")
    strict: bool | None = None


class OtherTextFormat(ResponsesWire):
    """`text` (the default) or `json_object`: free text."""

    type: str = "text"


TextFormat = Annotated[
    Annotated[JsonSchemaTextFormat, Tag("json_schema")] | Annotated[OtherTextFormat, Tag("other")],
    _tag(("json_schema",), "other"),
]


class TextConfig(ResponsesWire):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(ResponsesWire):
    effort: str | None = None
    summary: str | None = None


# --- the request --------------------------------------------------------------------------

MAX_INPUT_ITEMS = limits.MAX_MESSAGES * 4  # a turn of Codex's is up to four items


class ResponsesRequest(ResponsesWire):
    """Body of `POST /v1/responses`."""

    model: limits.NameOrEmpty = ""
    input: str | Annotated[list[InputItemOrEasy], Field(max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=limits.MAX_TOOLS)] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: (
        Annotated[int, Field(strict=True, ge=1, le=limits.MAX_OUTPUT_TOKENS)] | None
    ) = None
    reasoning: ReasoningConfig | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # OpenAI keeps responses unless told not to; Codex says `false` and resends its history.
    store: bool | None = None
    # Bounded as ids are (ours are 29 characters): a 4 MB id was echoed in a 4 MB error.
    previous_response_id: limits.NameOrEmpty | None = None
    # Codex's per-conversation key, shown in stats: bounded as ids are.
    prompt_cache_key: limits.NameOrEmpty | None = None
    include: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _tools_in_namespaces_count(self) -> ResponsesRequest:
        """The tool limit counts the function tools a namespace holds: they are offered to
        the model one by one, as top-level ones are."""
        count = sum(len(t.tools) if isinstance(t, NamespaceTool) else 1 for t in self.tools or [])
        if count > limits.MAX_TOOLS:
            raise ValueError(
                f"tools: {count} tools, namespaces' included (at most {limits.MAX_TOOLS})"
            )
        return self

    @property
    def items(self) -> list[InputItem]:
        """`input` as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    @property
    def json_schema(self) -> dict[str, Any] | None:
        fmt = self.text.format if self.text is not None else None
        return dict(fmt.json_schema) if isinstance(fmt, JsonSchemaTextFormat) else None


# --- the response -------------------------------------------------------------------------


class OutputWire(BaseModel):
    model_config = ConfigDict(extra="allow")


class OutputTextPart(OutputWire):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(OutputWire):
    type: Literal["message"] = "message"
    id: str
    status: str = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart] = Field(default_factory=list)


class OutputFunctionCall(OutputWire):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: str = "in_progress"
    namespace: str | None = None


class OutputCustomToolCall(OutputWire):
    """A call of a freeform tool: `input` is the raw text the model wrote."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str = ""
    status: str = "in_progress"


class SummaryPart(OutputWire):
    type: Literal["summary_text"] = "summary_text"
    text: str = ""


class OutputReasoning(OutputWire):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryPart] = Field(default_factory=list)
    status: str = "in_progress"
    encrypted_content: str | None = None  # when `include` asks: server/sealed_reasoning.py


class SearchSource(OutputWire):
    type: Literal["url"] = "url"
    url: str


class SearchAction(OutputWire):
    type: Literal["search"] = "search"
    query: str = ""
    sources: list[SearchSource] | None = None


class OutputWebSearchCall(OutputWire):
    """A web search the server ran (`status` failed: the search gave no results)."""

    type: Literal["web_search_call"] = "web_search_call"
    id: str
    status: Literal["in_progress", "searching", "completed", "failed"] = "in_progress"
    action: SearchAction = Field(default_factory=SearchAction)


OutputItem = (
    OutputMessage
    | OutputFunctionCall
    | OutputCustomToolCall
    | OutputReasoning
    | OutputWebSearchCall
)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """`input_tokens` is the whole prompt (OpenAI's meaning), of which `cached_tokens` were
    read from the prefix cache."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseObject(OutputWire):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus = "in_progress"
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = False
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    truncation: str = "disabled"


# --- stream events ------------------------------------------------------------------------


class StreamEvent(BaseModel):
    """One event of a Responses stream; the SSE event name is its `type`."""

    type: str
    sequence_number: int = 0


class ResponseLifecycleEvent(StreamEvent):
    """response.created / .in_progress / .completed / .incomplete / .failed."""

    response: ResponseObject


class OutputItemEvent(StreamEvent):
    """response.output_item.added / .done."""

    output_index: int
    item: OutputItem


class ContentPartEvent(StreamEvent):
    """response.content_part.added / .done."""

    item_id: str
    output_index: int
    content_index: int
    part: OutputTextPart


class TextDeltaEvent(StreamEvent):
    """response.output_text.delta."""

    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(StreamEvent):
    """response.output_text.done."""

    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class WebSearchCallEvent(StreamEvent):
    """response.web_search_call.in_progress / .searching / .completed."""

    item_id: str
    output_index: int


class ItemDeltaEvent(StreamEvent):
    """response.function_call_arguments.delta, response.custom_tool_call_input.delta: the
    next piece of a call's arguments or of a custom call's raw input."""

    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(StreamEvent):
    """response.function_call_arguments.done."""

    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomInputDoneEvent(StreamEvent):
    """response.custom_tool_call_input.done."""

    item_id: str
    output_index: int
    input: str


class SummaryPartEvent(StreamEvent):
    """response.reasoning_summary_part.added / .done."""

    item_id: str
    output_index: int
    summary_index: int
    part: SummaryPart


class SummaryDeltaEvent(StreamEvent):
    """response.reasoning_summary_text.delta."""

    item_id: str
    output_index: int
    summary_index: int
    delta: str


class SummaryDoneEvent(StreamEvent):
    """response.reasoning_summary_text.done."""

    item_id: str
    output_index: int
    summary_index: int
    text: str


# --- errors -------------------------------------------------------------------------------
