"""Responses request → engine `GenerationRequest`, and the names and ids between them.

Items become chat-template messages: `instructions` and leading `system`/`developer` messages
one system prompt (later ones stay in place), a run of assistant-side items (reasoning,
assistant message, function calls, custom tool calls with their text as an `input` argument,
`local_shell_call`s as calls of a `shell` tool) one assistant message, each call's output a
tool message in the order the calls were made. The same history maps to the same messages on
every turn, so the prefix cache keeps hitting as Codex resends its whole history.

Ids and names are pure functions both ways, for the same reason: an engine call id `toolu_X`
is `call_X` on the wire (and back), and a namespace tool's function is offered to the model
under its own name (`<namespace>__<name>` when that name is taken) and answered with `name`
and `namespace` apart, as Codex routes it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxlaunch.engine.types import (
    FREEFORM_INPUT,
    ChatMessage,
    GenerationRequest,
    InputGrammar,
    InvalidRequest,
    RequestKind,
    Role,
    Sampling,
    ToolCallRecord,
    ToolChoice,
    ToolSpec,
)
from mlxlaunch.protocol.limits import shown_names
from mlxlaunch.protocol.openai_responses import (
    WEB_SEARCH_TOOL_TYPES,
    ContentPart,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    GrammarInputFormat,
    InputImage,
    InputItem,
    InputText,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    MessageItem,
    NamespaceTool,
    OutputText,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    ToolChoiceCustom,
    ToolChoiceFunction,
    ToolChoiceOther,
    WebSearchTool,
)
from mlxlaunch.server.call_arguments import freeform_tool, history_arguments
from mlxlaunch.server.images import TEXT_ONLY, ImageAccess, ImageCheck, url_image
from mlxlaunch.server.sealed_reasoning import ForgedSeal, ReasoningSeal
from mlxlaunch.server.web_search import WebSearchPolicy, web_search_spec

log = logging.getLogger("mlxlaunch.server")

PART_SEPARATOR = "\n\n"
ENGINE_CALL_PREFIX = "toolu_"
CLIENT_CALL_PREFIX = "call_"
# Output cap when the client sets none: the engine clamps it to what the window leaves.
DEFAULT_MAX_OUTPUT_TOKENS = 32_768
# The model sees a `local_shell_call` as a call of this tool, with the arguments of Codex's
# own function-style shell tool (command, workdir, timeout_ms).
LOCAL_SHELL_TOOL = "shell"
# What the model calls the hosted web search tool.
WEB_SEARCH_TOOL = "web_search"
# Items whose whole content is another server's encryption: dropping one would silently lose
# the conversation it stands for.
_SEALED_ITEMS = ("compaction", "compaction_summary")
_CODEX_MARKER = "You are a coding agent running in the Codex CLI"
# Reasoning efforts that mean "do not think".
_NO_THINKING = ("none", "minimal")


def client_call_id(engine_id: str) -> str:
    """The `call_id` a client sees for the engine's call `engine_id`."""
    return CLIENT_CALL_PREFIX + engine_id.removeprefix(ENGINE_CALL_PREFIX)


def engine_call_id(call_id: str) -> str:
    """The engine's id for a `call_id` a client sent back (the inverse of `client_call_id`;
    other servers' ids pass through as they are)."""
    if call_id.startswith(CLIENT_CALL_PREFIX):
        return ENGINE_CALL_PREFIX + call_id.removeprefix(CLIENT_CALL_PREFIX)
    return call_id


@dataclass(frozen=True)
class ToolNames:
    """The tools of one request under the names the model sees, both ways, and which of
    them are freeform (`custom`) tools, answered with raw text."""

    wire: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # model → (ns, name)
    model: dict[tuple[str | None, str], str] = field(default_factory=dict)
    custom: set[str] = field(default_factory=set)  # model names of the custom tools

    def for_model(self, namespace: str | None, name: str) -> str:
        return self.model.get((namespace, name), name)

    def for_client(self, model_name: str) -> tuple[str | None, str]:
        return self.wire.get(model_name, (None, model_name))


def offered_tools(body: ResponsesRequest) -> tuple[list[ToolSpec], ToolNames]:
    """The function and custom tools, namespaces flattened; other tool types (hosted ones)
    are ignored (one note)."""
    top: list[ToolSpec] = []
    grouped: list[tuple[str, str | None, FunctionTool]] = []
    ignored: list[str] = []
    names = ToolNames()
    for index, tool in enumerate(body.tools or []):
        if isinstance(tool, FunctionTool):
            top.append(_spec(tool.name, tool))
        elif isinstance(tool, CustomTool):
            top.append(_custom_spec(index, tool))
            names.custom.add(tool.name)
        elif isinstance(tool, WebSearchTool):
            continue  # the server runs it (`search_policies`)
        elif isinstance(tool, NamespaceTool):
            for member in tool.tools:
                if isinstance(member, FunctionTool):
                    grouped.append((tool.name, tool.description, member))
                else:
                    ignored.append(f"{tool.name}.{member.type or '?'}")
        else:
            ignored.append(tool.type or "?")
    if ignored:
        log.info("responses: tool types not served, ignored: %s", shown_names(ignored))
    specs: list[ToolSpec] = []
    taken = {spec.name for spec in top}
    for spec in top:
        names.wire[spec.name] = (None, spec.name)
        names.model[(None, spec.name)] = spec.name
        specs.append(spec)
    for namespace, _, tool in grouped:
        model_name = tool.name if tool.name not in taken else f"{namespace}__{tool.name}"
        taken.add(model_name)
        names.wire[model_name] = (namespace, tool.name)
        names.model[(namespace, tool.name)] = model_name
        specs.append(_spec(model_name, tool))
    return specs, names


def _spec(name: str, tool: FunctionTool) -> ToolSpec:
    parameters = dict(tool.parameters or {"type": "object", "properties": {}})
    return ToolSpec(
        name=name,
        description=tool.description or "",
        parameters=parameters,
        strict=bool(tool.strict),
    )


def _custom_spec(index: int, tool: CustomTool) -> ToolSpec:
    fmt = tool.format
    grammar = None
    if isinstance(fmt, GrammarInputFormat):
        grammar = InputGrammar(fmt.syntax, fmt.definition, f"tools[{index}].format.definition")
    return freeform_tool(tool.name, tool.description or "", grammar)


def to_generation_request(
    body: ResponsesRequest,
    items: Sequence[InputItem],
    *,
    request_id: str,
    images: ImageAccess,
    thinks: bool,
    context_window: int | None,
    searches: Collection[str] = (),
    seal: ReasoningSeal | None = None,
) -> tuple[GenerationRequest, ToolNames]:
    """The engine request for `body` whose whole input is `items` (a continued response's
    history included), and the tool names to answer calls with.

    `searches`: the names of the web search tools the server runs (`search_policies`);
    `seal`: opens the reasoning this server sealed into `encrypted_content` (None: none is).

    Raises:
        InvalidRequest: an output for an unknown call, a call left without output, an image
            for a model without vision, arguments that are not a JSON object.
    """
    tools, names = offered_tools(body)
    tools += [web_search_spec(name) for name in searches]
    check = ImageCheck(images)
    messages = conversation(items, names, check, seal)
    if body.instructions:
        if messages and messages[0].role == "system":
            messages[0].content = PART_SEPARATOR.join((body.instructions, messages[0].content))
        else:
            messages.insert(0, ChatMessage(role="system", content=body.instructions))
    effort = body.reasoning.effort if body.reasoning is not None else None
    thinking = thinks and body.reasoning is not None and effort not in _NO_THINKING
    max_tokens = body.max_output_tokens or min(
        context_window or DEFAULT_MAX_OUTPUT_TOKENS, DEFAULT_MAX_OUTPUT_TOKENS
    )
    return (
        GenerationRequest(
            messages=messages,
            max_tokens=max_tokens,
            tools=tools,
            tool_choice=tool_choice(body, names, searches),
            sampling=Sampling(temperature=body.temperature, top_p=body.top_p),
            thinking=thinking,
            response_schema=body.json_schema,
            schema_field="text.format.schema",
            tool_schema_field="parameters",
            request_id=request_id,
            kind=request_kind(messages, tools),
            model_alias=body.model,
            cache_key=body.prompt_cache_key or "",
            images=check.images,
        ),
        names,
    )


def tool_choice(
    body: ResponsesRequest, names: ToolNames, searches: Collection[str] = ()
) -> ToolChoice:
    parallel = body.parallel_tool_calls is not False
    choice = body.tool_choice
    if choice == "none":
        return ToolChoice(mode="none")
    if choice == "required":
        return ToolChoice(mode="any", parallel=parallel, wire="required")
    if isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
        named = next((m for m, (_, n) in names.wire.items() if n == choice.name), choice.name)
        return ToolChoice(mode="tool", name=named, parallel=parallel)
    if _forces_search(body) and WEB_SEARCH_TOOL in searches:  # the hosted tool, by its type
        return ToolChoice(mode="tool", name=WEB_SEARCH_TOOL, parallel=parallel)
    return ToolChoice(mode="auto", parallel=parallel)


def _forces_search(body: ResponsesRequest) -> bool:
    choice = body.tool_choice
    return isinstance(choice, ToolChoiceOther) and choice.type in WEB_SEARCH_TOOL_TYPES


def search_policies(body: ResponsesRequest) -> dict[str, WebSearchPolicy]:
    """The request's hosted web search tool, under the name the model calls it (none when a
    function tool of the client's already has the name).

    It is offered whether or not a search backend is configured: without one, a call the
    model makes is answered with the honest error that says how to configure one (a
    `web_search_call` that failed, and that text), never dropped in silence.
    """
    functions = {tool.name for tool in body.tools or [] if isinstance(tool, FunctionTool)}
    for tool in body.tools or []:
        if isinstance(tool, WebSearchTool) and WEB_SEARCH_TOOL not in functions:
            allowed = tool.filters.allowed_domains if tool.filters else None
            policy = WebSearchPolicy(WEB_SEARCH_TOOL, allowed_domains=tuple(allowed or ()))
            return {WEB_SEARCH_TOOL: policy}
    return {}


def request_kind(messages: list[ChatMessage], tools: list[ToolSpec]) -> RequestKind:
    """Label for stats: Codex's main agent, or other."""
    system = messages[0].content if messages and messages[0].role == "system" else ""
    return "main" if tools and _CODEX_MARKER in system else "other"


class _Conversation:
    """Messages being built, with the open assistant turn's calls and their outputs."""

    def __init__(
        self, names: ToolNames, images: ImageCheck, seal: ReasoningSeal | None = None
    ) -> None:
        self.names = names
        self.images = images
        self.seal = seal
        self.out: list[ChatMessage] = []
        self.assistant: ChatMessage | None = None  # the run of assistant items being read
        self.calls: list[ToolCallRecord] = []  # the latest assistant turn's calls
        self.results: dict[str, ChatMessage] = {}  # call id → its tool message
        self.ignored: set[str] = set()

    def add(self, index: int, item: InputItem) -> None:
        if isinstance(item, MessageItem):
            self._message(index, item)
        elif isinstance(item, FunctionCallItem):
            self._function_call(index, item)
        elif isinstance(item, FunctionCallOutputItem):
            self._function_output(index, item)
        elif isinstance(item, CustomToolCallItem):
            name = self.names.for_model(None, item.name)
            self._call(item.call_id, name, {FREEFORM_INPUT: item.input})
        elif isinstance(item, CustomToolCallOutputItem):
            output = self._text(f"input.{index}.output", item.output, in_tool_result=True)
            self._output(index, item.call_id, output, "custom_tool_call")
        elif isinstance(item, LocalShellCallItem):
            self._local_shell_call(item)
        elif isinstance(item, LocalShellCallOutputItem):
            call_id = item.call_id or item.id or ""
            self._output(index, call_id, item.output, "local_shell_call")
        elif isinstance(item, ReasoningItem):
            text = self._sealed(index, item.encrypted_content)
            if text is None:  # another server's, or none: what is readable of it
                text = "\n".join(p.text for p in [*item.summary, *(item.content or [])] if p.text)
            turn = self._open_assistant()
            if text:
                turn.reasoning = "\n".join(t for t in (turn.reasoning, text) if t)
        elif item.type in _SEALED_ITEMS:
            raise InvalidRequest(
                f"input.{index}: a {item.type} item holds a summary of the conversation "
                "encrypted by the server that compacted it, which this server cannot read; "
                "start a new conversation, or compact it against this server"
            )
        else:
            self.ignored.add(item.type or "?")

    def _sealed(self, index: int, content: str | None) -> str | None:
        """The reasoning exactly as generated, where this server sealed it (None: not ours)."""
        if self.seal is None:
            return None
        try:
            return self.seal.open(content)
        except ForgedSeal as exc:
            raise InvalidRequest(f"input.{index}.encrypted_content: {exc}") from exc

    def _open_assistant(self) -> ChatMessage:
        if self.assistant is None:
            self.close_results()
            self.assistant = ChatMessage(role="assistant")
            self.out.append(self.assistant)
        return self.assistant

    def _message(self, index: int, item: MessageItem) -> None:
        text = self._text(f"input.{index}.content", item.content)
        if item.role == "assistant":
            turn = self._open_assistant()
            turn.content += text
            return
        self._end_assistant()
        self.close_results()
        role: Role = "user" if item.role == "user" else "system"
        if role == "system" and self.out and self.out[-1].role == "system":
            self.out[-1].content = PART_SEPARATOR.join(p for p in (self.out[-1].content, text) if p)
        else:
            self.out.append(ChatMessage(role=role, content=text))

    def _function_call(self, index: int, item: FunctionCallItem) -> None:
        arguments = history_arguments(item.arguments, f"input.{index}.arguments")
        self._call(item.call_id, self.names.for_model(item.namespace, item.name), arguments)

    def _local_shell_call(self, item: LocalShellCallItem) -> None:
        action = item.action
        arguments: dict[str, Any] = {"command": list(action.command)}
        if action.working_directory is not None:
            arguments["workdir"] = action.working_directory
        if action.timeout_ms is not None:
            arguments["timeout_ms"] = action.timeout_ms
        self._call(item.call_id or item.id or "", LOCAL_SHELL_TOOL, arguments)

    def _call(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        turn = self._open_assistant()
        call = ToolCallRecord(id=engine_call_id(call_id), name=name, arguments=arguments)
        turn.tool_calls.append(call)
        self.calls.append(call)

    def _function_output(self, index: int, item: FunctionCallOutputItem) -> None:
        # A tool's picture (Codex's view_image) becomes a placeholder.
        output = self._text(f"input.{index}.output", item.output, in_tool_result=True)
        self._output(index, item.call_id, output, "function_call")

    def _output(self, index: int, call_id: str, output: str, kind: str) -> None:
        """The output of the latest assistant turn's call `call_id` (a `kind` item's)."""
        self._end_assistant()
        wanted = engine_call_id(call_id)
        call = next((c for c in self.calls if c.id == wanted), None)
        if call is None:
            raise InvalidRequest(
                f"input.{index}: no {kind} with call_id {call_id!r} precedes this {kind}_output"
            )
        if call.id in self.results:
            raise InvalidRequest(f"input.{index}: a second output for call_id {call_id!r}")
        self.results[call.id] = ChatMessage(
            role="tool", content=output, tool_call_id=call.id, name=call.name
        )

    def _end_assistant(self) -> None:
        self.assistant = None

    def close_results(self) -> None:
        """The outputs of the latest calls, in the order the calls were made; every call
        needs its output before the conversation goes on (or ends)."""
        if not self.calls:
            return
        missing = [c.id for c in self.calls if c.id not in self.results]
        if missing:
            raise InvalidRequest(
                "no function_call_output found for function call(s) "
                + ", ".join(client_call_id(m) for m in missing)
            )
        self.out.extend(self.results[c.id] for c in self.calls)
        self.calls, self.results = [], {}

    def _text(
        self, where: str, content: str | list[ContentPart], *, in_tool_result: bool = False
    ) -> str:
        if isinstance(content, str):
            return content
        texts: list[str] = []
        for number, part in enumerate(content):
            if isinstance(part, InputText | OutputText):
                texts.append(part.text)
            elif isinstance(part, Refusal):
                texts.append(part.refusal)
            elif isinstance(part, InputImage):
                key = "image_url" if part.image_url else "file_id"
                image = url_image(
                    f"{where}.{number}.{key}", part.image_url, in_tool_result=in_tool_result
                )
                texts.append(self.images.placeholder(image))
            else:
                self.ignored.add(f"{part.type or '?'} part")
        return PART_SEPARATOR.join(texts)


def conversation(
    items: Sequence[InputItem],
    names: ToolNames,
    images: ImageCheck | None = None,
    seal: ReasoningSeal | None = None,
) -> list[ChatMessage]:
    """The chat-template messages for `items`, in order (images through `images`; None: a
    text-only model's; reasoning this server sealed opened with `seal`)."""
    built = _Conversation(names, images or ImageCheck(TEXT_ONLY), seal)
    for index, item in enumerate(items):
        built.add(index, item)
    built._end_assistant()
    built.close_results()
    if built.ignored:
        # Server-side calls (web_search_call, …) have no meaning to a local model: dropped.
        log.warning("responses: input items not served, ignored: %s", shown_names(built.ignored))
    return built.out
