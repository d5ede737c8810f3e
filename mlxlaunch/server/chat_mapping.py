"""Chat Completions request → engine `GenerationRequest`, in one pure module.

Beside the Anthropic mapping (server/mapping.py), onto the same engine request: one render
path, one output parser, one prefix cache. Also here: the `call_…` ids OpenAI clients see for
the engine's tool-call ids (and back), and the rule that picks the OpenAI shape of
`/v1/models`.

Why the id mapping is pure: the id a client sends back in a `tool` message (and in the
assistant's `tool_calls`) must render to the same tokens on every later turn, and to exactly
the id the model wrote where it wrote one (engine/tool_ids.py), so the prefix cache keeps
hitting. The engine names calls `toolu_…`; an OpenAI client sees `call_` + what follows
`toolu_`, and `call_mx…` (a call whose id the model wrote) maps back to `toolu_mx…`. Any
other id (a random call of ours, ids from another server) stays as the client sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mlxlaunch.engine.tool_ids import ENCODED_PREFIX
from mlxlaunch.engine.types import (
    FREEFORM_INPUT,
    ChatMessage,
    GenerationRequest,
    InputGrammar,
    InvalidRequest,
    Sampling,
    ToolCallRecord,
    ToolChoice,
    ToolSpec,
)
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.openai_chat import (
    AssistantMessage,
    AudioPart,
    ChatCompletionRequest,
    ChatTool,
    CustomDefinition,
    FilePart,
    GrammarFormat,
    ImageUrlPart,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    OpenAIModel,
    OpenAIModelList,
    RefusalPart,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from mlxlaunch.protocol.responses import ModelEntry
from mlxlaunch.server.call_arguments import freeform_tool, history_arguments
from mlxlaunch.server.images import TEXT_ONLY, ImageAccess, ImageCheck, url_image
from mlxlaunch.server.mapping import BLOCK_SEPARATOR

log = logging.getLogger("mlxlaunch.server")

ENGINE_ID_PREFIX = "toolu_"
CLIENT_ID_PREFIX = "call_"
# What `json_object` asks for: some JSON object (OpenAI: "valid JSON", always an object).
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# reasoning_effort values that ask for no thinking; any other value asks for thinking.
NO_REASONING = frozenset({"none", "minimal"})


# --- tool-call ids ---------------------------------------------------------------------------


def client_call_id(engine_id: str) -> str:
    """The `call_…` id an OpenAI client sees for the engine's call `engine_id`."""
    return CLIENT_ID_PREFIX + engine_id.removeprefix(ENGINE_ID_PREFIX)


def engine_call_id(client_id: str) -> str:
    """The history id for a call the client names `client_id` (inverse of `client_call_id`
    for the calls whose id the model wrote; any other id as it is)."""
    encoded = CLIENT_ID_PREFIX + ENCODED_PREFIX.removeprefix(ENGINE_ID_PREFIX)
    if client_id.startswith(encoded):
        return ENGINE_ID_PREFIX + client_id.removeprefix(CLIENT_ID_PREFIX)
    return client_id


# --- /v1/models ------------------------------------------------------------------------------


def speaks_openai(headers: Mapping[str, str]) -> bool:
    """Whether a request comes from an OpenAI-style client, so `/v1/models` answers in the
    OpenAI shape.

    The rule: Anthropic's API refuses any request without `anthropic-version`, so every
    Anthropic client (the SDKs, Claude Code) sends it, and `x-api-key` is Anthropic's way to
    authenticate; a request with neither is an OpenAI-style one (the OpenAI SDKs, curl, the
    AI SDK, LiteLLM: `Authorization: Bearer` or nothing). `x-stainless-*` headers tell nothing:
    both vendors' SDKs send them.
    """
    return "anthropic-version" not in headers and "x-api-key" not in headers


def openai_model_body(entry: ModelEntry) -> dict[str, Any]:
    """`GET /v1/models/{id}` in the OpenAI shape."""
    return OpenAIModel.from_entry(entry).model_dump()


def openai_list_body(entries: Sequence[ModelEntry]) -> dict[str, Any]:
    """`GET /v1/models` in the OpenAI shape."""
    return OpenAIModelList(data=[OpenAIModel.from_entry(e) for e in entries]).model_dump()


# --- the request -----------------------------------------------------------------------------


def to_generation_request(
    req: ChatCompletionRequest,
    *,
    request_id: str,
    context_window: int,
    images: ImageAccess = TEXT_ONLY,
    model_thinks: bool = False,
) -> GenerationRequest:
    """Map a validated Chat Completions body to the engine's request.

    Args:
        req: the validated body.
        request_id: the engine request id (the answer's `chatcmpl-…` id).
        context_window: the model's window: the output cap when the client sets none (the
            engine lowers it to what the prompt leaves, as OpenAI's default does).
        images: whether the model sees images, and their limits (`server.images`): a user's
            image to a text-only model is a 400, one in a tool message a placeholder.
        model_thinks: the model has a thinking mode for `reasoning_effort` to switch on.

    Raises:
        InvalidRequest: the conversation is inconsistent (a tool message for an unknown call,
            a call left without its result, arguments that are no JSON object) or holds
            images the model cannot read.
    """
    schema: dict[str, Any] | None = None
    if isinstance(req.response_format, JsonObjectFormat):
        schema = dict(JSON_OBJECT_SCHEMA)
    elif isinstance(req.response_format, JsonSchemaFormat):
        schema = dict(req.response_format.json_schema.json_schema or JSON_OBJECT_SCHEMA)
    sampling = Sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
    )
    check = ImageCheck(images)
    return GenerationRequest(
        messages=conversation(req.messages, check),
        max_tokens=req.output_limit or context_window,
        tools=offered_tools(req.tools or [], request_id),
        tool_choice=tool_choice(req),
        sampling=sampling,
        thinking=model_thinks and wants_thinking(req),
        stop_sequences=list(req.stop or []),
        response_schema=schema,
        schema_field="response_format.json_schema.schema",
        tool_schema_field="function.parameters",
        request_id=request_id,
        model_alias=req.model,
        images=check.images,
    )


def offered_tools(tools: Iterable[ChatTool], request_id: str) -> list[ToolSpec]:
    """The function and custom tools; other tool types are ignored, with a note in the log."""
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        if tool.custom is not None and tool.type == "custom":
            specs.append(_custom_spec(index, tool.custom))
            continue
        if not tool.is_function or tool.function is None:
            log.info("%s: ignoring a tool of type %s (only function tools are offered)",
                     request_id, shown(repr(tool.type)))  # fmt: skip
            continue
        function = tool.function
        parameters = function.parameters or {"type": "object", "properties": {}}
        specs.append(
            ToolSpec(
                name=function.name,
                description=function.description,
                parameters=dict(parameters),
                strict=bool(function.strict),
            )
        )
    return specs


def _custom_spec(index: int, tool: CustomDefinition) -> ToolSpec:
    fmt = tool.format
    grammar = None
    if isinstance(fmt, GrammarFormat):
        where = f"tools[{index}].custom.format.grammar.definition"
        grammar = InputGrammar(fmt.grammar.syntax, fmt.grammar.definition, where)
    return freeform_tool(tool.name, tool.description, grammar)


def custom_names(tools: Iterable[ChatTool]) -> set[str]:
    """The names of the request's custom tools, whose calls are answered as raw text."""
    return {t.custom.name for t in tools if t.type == "custom" and t.custom is not None}


def tool_choice(req: ChatCompletionRequest) -> ToolChoice:
    """The engine's tool choice; `parallel_tool_calls: false` means at most one call."""
    parallel = req.parallel_tool_calls is not False
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        return ToolChoice(mode="tool", name=choice.name, parallel=parallel)
    if choice == "none":
        return ToolChoice(mode="none")
    if choice == "required":
        return ToolChoice(mode="any", parallel=parallel, wire="required")
    return ToolChoice(mode="auto", parallel=parallel)


def wants_thinking(req: ChatCompletionRequest) -> bool:
    """Thinking is off unless asked for (as on the Messages path): by `reasoning_effort`
    other than none/minimal, or by vLLM's `chat_template_kwargs.enable_thinking`."""
    enable = (req.chat_template_kwargs or {}).get("enable_thinking")
    if isinstance(enable, bool):
        return enable
    return req.reasoning_effort is not None and req.reasoning_effort not in NO_REASONING


# --- the conversation ------------------------------------------------------------------------


def conversation(
    messages: Sequence[SystemMessage | UserMessage | AssistantMessage | ToolMessage],
    images: ImageCheck | None = None,
) -> list[ChatMessage]:
    """Turn Chat Completions messages into chat-template messages, in order.

    `system`/`developer` messages stay in place (consecutive ones merge); the tool messages
    after an assistant turn are rendered in the order the assistant issued its calls (what
    templates and models expect, whatever order the client sent them in). Images go through
    `images` (None: a text-only model's).
    """
    images = images or ImageCheck(TEXT_ONLY)
    out: list[ChatMessage] = []
    calls = _OpenCalls(images)
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            calls.answer(index, message)
            continue
        out.extend(calls.take_results())
        if isinstance(message, SystemMessage):
            text = _text(message.content)
            if out and out[-1].role == "system":
                out[-1].content = BLOCK_SEPARATOR.join(p for p in (out[-1].content, text) if p)
            else:
                out.append(ChatMessage(role="system", content=text))
        elif isinstance(message, AssistantMessage):
            calls.check_all_answered()
            turn = _assistant_message(index, message)
            calls.open(turn.tool_calls)
            out.append(turn)
        else:
            calls.check_all_answered()
            out.append(_user_message(index, message, images))
    out.extend(calls.take_results())
    return out


class _OpenCalls:
    """The calls of the latest assistant turn and the tool messages answering them so far."""

    def __init__(self, images: ImageCheck) -> None:
        self._images = images
        self._calls: list[ToolCallRecord] = []
        self._answered: set[str] = set()
        self._results: list[tuple[int, ChatMessage]] = []  # (call position, message)

    def open(self, calls: list[ToolCallRecord]) -> None:
        self._calls, self._answered = list(calls), set()

    def answer(self, index: int, message: ToolMessage) -> None:
        call_id = engine_call_id(message.tool_call_id)
        for position, call in enumerate(self._calls):
            if call.id != call_id:
                continue
            if call_id in self._answered:
                raise InvalidRequest(
                    f"messages.{index}.tool_call_id: {message.tool_call_id!r} is answered "
                    "more than once"
                )
            self._answered.add(call_id)
            content = message.content
            if not isinstance(content, str):
                content = _parts_text(f"messages.{index}.content", content, self._images, True)
            result = ChatMessage(role="tool", content=content, tool_call_id=call.id, name=call.name)
            self._results.append((position, result))
            return
        raise InvalidRequest(
            f"messages.{index}.tool_call_id: {message.tool_call_id!r} does not match any "
            "tool call of the previous assistant message"
        )

    def take_results(self) -> list[ChatMessage]:
        results, self._results = self._results, []
        return [message for _, message in sorted(results, key=lambda item: item[0])]

    def check_all_answered(self) -> None:
        """Before the next user or assistant message, every call must have its result."""
        missing = [c.id for c in self._calls if c.id not in self._answered]
        if missing:
            raise InvalidRequest(
                "an assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'; these did not have response messages: "
                + ", ".join(client_call_id(call_id) for call_id in missing)
            )
        self._calls = []


def _call_record(index: int, n: int, call: ToolCall) -> ToolCallRecord:
    """A call of the history: a custom tool's raw text is its one `input` argument."""
    if call.custom is not None and call.type == "custom":
        arguments = {FREEFORM_INPUT: call.custom.input}
        return ToolCallRecord(engine_call_id(call.id), call.custom.name, arguments)
    assert call.function is not None  # the wire type requires it
    where = f"messages.{index}.tool_calls.{n}.function.arguments"
    arguments = history_arguments(call.function.arguments, where)
    return ToolCallRecord(engine_call_id(call.id), call.function.name, arguments)


def _assistant_message(index: int, message: AssistantMessage) -> ChatMessage:
    content = message.content
    if isinstance(content, list):
        content = "".join(p.text if isinstance(p, TextPart) else _refusal(p) for p in content)
    calls = [_call_record(index, n, call) for n, call in enumerate(message.tool_calls or [])]
    reasoning = message.reasoning_content or message.reasoning
    return ChatMessage(
        role="assistant", content=content or "", reasoning=reasoning or None, tool_calls=calls
    )


def _refusal(part: RefusalPart) -> str:
    return part.refusal


def _user_message(index: int, message: UserMessage, images: ImageCheck) -> ChatMessage:
    content = message.content
    if isinstance(content, str):
        return ChatMessage(role="user", content=content)
    return ChatMessage(
        role="user", content=_parts_text(f"messages.{index}.content", content, images, False)
    )


def _parts_text(
    where: str,
    parts: Sequence[TextPart | ImageUrlPart | AudioPart | FilePart],
    images: ImageCheck,
    in_tool_result: bool,
) -> str:
    texts: list[str] = []
    for number, part in enumerate(parts):
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ImageUrlPart):
            url = part.image_url.get("url")
            image = url_image(
                f"{where}.{number}.image_url.url",
                url if isinstance(url, str) else None,
                in_tool_result=in_tool_result,
            )
            texts.append(images.placeholder(image))
        elif isinstance(part, AudioPart):
            texts.append("[audio omitted]")
        elif isinstance(part, FilePart):
            texts.append("[file omitted]")
    return BLOCK_SEPARATOR.join(texts)


def _text(content: str | list[TextPart]) -> str:
    if isinstance(content, str):
        return content
    return BLOCK_SEPARATOR.join(part.text for part in content)
