"""Anthropic request → engine `GenerationRequest`, in one pure module.

The engine speaks chat-template shape (system/user/assistant/tool messages with tool calls and
reasoning); this module is the only place that knows both vocabularies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast, get_args

from mlxlaunch.engine.types import (
    ChatMessage,
    GenerationRequest,
    InvalidRequest,
    RequestKind,
    Sampling,
    ToolCallRecord,
    ToolChoice,
    ToolSpec,
)
from mlxlaunch.protocol.requests import (
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    RedactedThinkingBlock,
    ServerToolUseBlock,
    TextBlock,
    ThinkingAdaptive,
    ThinkingBlock,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolResultPart,
    ToolUseBlock,
    WebSearchErrorPart,
    WebSearchToolResultBlock,
)
from mlxlaunch.protocol.responses import WebSearchErrorCode
from mlxlaunch.server.agent_headers import NO_AGENT, AgentHeaders
from mlxlaunch.server.images import (
    IMAGE_PLACEHOLDER,
    TEXT_ONLY,
    ImageAccess,
    ImageCheck,
    anthropic_image,
)
from mlxlaunch.server.search_backends import SearchResult
from mlxlaunch.server.web_search import (
    TOOL_ERROR_MARK,
    SearchOutcome,
    WebSearchPolicy,
    decode_page,
    search_call_messages,
    web_search_spec,
)

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
BLOCK_SEPARATOR = "\n\n"
# Session-title requests: characters allowed in an unbounded title string, and the output cap
# that always leaves room for them (4 tokens per character at worst, plus the JSON around).
TITLE_MAX_CHARS = 60
TITLE_MAX_TOKENS = 4 * TITLE_MAX_CHARS + 16

# Markers of Claude Code's main-agent system prompt (interactive CLI and `-p`/SDK mode).
# Only used to label requests in stats; a wrong guess changes nothing else.
_MAIN_AGENT_MARKERS = (
    "You are an interactive agent",
    "You are an interactive CLI tool",
    "You are an agent working with the user toward their goals",
)
_CLAUDE_CODE_MARKERS = ("Claude Code", "Claude Agent SDK")


def to_generation_request(
    req: MessagesRequest | CountTokensRequest,
    *,
    request_id: str = "",
    images: ImageAccess = TEXT_ONLY,
    agent: AgentHeaders = NO_AGENT,
) -> GenerationRequest:
    """Map a validated request body to the engine's request.

    A count_tokens body has no `max_tokens`; it maps with `max_tokens=1` (only the prompt counts).

    Args:
        req: the validated body.
        request_id: the engine request id (the response's `msg_…` id).
        images: whether the model sees images, and their limits (`server.images`): a user's
            image to a text-only model is a 400, one in a tool result a placeholder.
        agent: Claude Code's session and agent ids from the request's headers: they class the
            request (main loop or subagent) and key its conversation in stats.

    Raises:
        InvalidRequest: the conversation is inconsistent (a tool_result for an unknown call, a
            call left without its result) or holds images the model cannot read.
    """
    system_text = system_prompt(req.system or [])
    messages: list[ChatMessage] = []
    if system_text:
        messages.append(ChatMessage(role="system", content=system_text))
    check = ImageCheck(images)
    messages.extend(conversation(req.messages, check))

    tools = [
        ToolSpec(
            name=tool.name,
            description=tool.description,
            parameters=dict(tool.input_schema or {}),
            strict=tool.strict,
        )
        for tool in req.tools or []
        if tool.is_client_tool
    ]
    tools += [web_search_spec(tool.name) for tool in req.tools or [] if tool.is_web_search]
    response_format = req.response_format
    thinking_on, budget = thinking_settings(req)
    has_tools = any(tool.is_client_tool for tool in req.tools or [])
    kind = agent.classify(request_kind(req, system_text), has_tools=has_tools)
    schema = dict(response_format.json_schema) if response_format else None

    if isinstance(req, MessagesRequest):
        max_tokens = req.max_tokens
        stop_sequences = list(req.stop_sequences or [])  # validated: none is blank
        # Unset stays None: the engine fills it from the model's recommended settings.
        sampling = Sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    else:
        max_tokens, stop_sequences, sampling = 1, [], Sampling()
    if kind == "title" and schema is not None:
        # A title is a side request the user waits on: answer it short and without thinking.
        thinking_on, budget = False, None
        max_tokens = min(max_tokens, TITLE_MAX_TOKENS)
        schema = bounded_strings(schema, TITLE_MAX_CHARS)

    return GenerationRequest(
        messages=messages,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice(req),
        sampling=sampling,
        thinking=thinking_on,
        thinking_budget=budget,
        stop_sequences=stop_sequences,
        response_schema=schema,
        request_id=request_id,
        kind=kind,
        model_alias=req.model,
        cache_key=agent.session_id,
        images=check.images,
    )


def search_policies(req: CountTokensRequest) -> dict[str, WebSearchPolicy]:
    """The request's web search tools by name, whose calls the server answers itself."""
    return {
        tool.name: WebSearchPolicy(
            tool.name,
            max_uses=tool.max_uses,
            allowed_domains=tuple(tool.allowed_domains or ()),
            blocked_domains=tuple(tool.blocked_domains or ()),
        )
        for tool in req.tools or []
        if tool.is_web_search
    }


def system_prompt(blocks: Sequence[TextBlock]) -> str:
    """Join the top-level system blocks, dropping Claude Code's per-conversation billing header
    (it changes every conversation and would defeat prefix caching)."""
    kept = [b.text for b in blocks if not b.text.lstrip().startswith(BILLING_HEADER_PREFIX)]
    return BLOCK_SEPARATOR.join(t for t in kept if t)


def conversation(
    turns: Iterable[InputMessage], images: ImageCheck | None = None
) -> list[ChatMessage]:
    """Turn Anthropic messages into chat-template messages, in order.

    tool_use blocks become the assistant's `tool_calls`; each tool_result becomes a `tool`
    message; thinking blocks become the assistant's `reasoning`; `system` turns stay in place
    (consecutive ones merge) and are never folded into the top-level system prompt. Images
    go through `images` (None: a text-only model's).
    """
    images = images or ImageCheck(TEXT_ONLY)
    calls = _OpenCalls()
    out: list[ChatMessage] = []
    answered_by_user = False  # a user turn followed the latest assistant turn
    for index, turn in enumerate(turns):
        if turn.role == "assistant":
            calls.check_all_answered()
            messages = _assistant_messages(turn)
            calls.open(messages[-1].tool_calls)
            answered_by_user = False
            out.extend(messages)
        elif turn.role == "system":
            text = BLOCK_SEPARATOR.join(b.text for b in turn.content if isinstance(b, TextBlock))
            if out and out[-1].role == "system":
                out[-1].content = BLOCK_SEPARATOR.join(p for p in (out[-1].content, text) if p)
            else:
                out.append(ChatMessage(role="system", content=text))
        else:
            out.extend(_user_messages(f"messages.{index}", turn, calls, images))
            answered_by_user = True
    if answered_by_user:  # the final user turn must answer the calls before it, too
        calls.check_all_answered()
    return out


class _OpenCalls:
    """The tool calls of the latest assistant turn, and which of them have a result yet.

    Results are paired with calls by id and rendered in the order the assistant issued the
    calls (templates and models expect that order, whatever order the client sent them in).
    """

    def __init__(self) -> None:
        self._calls: list[ToolCallRecord] = []
        self._answered: set[str] = set()

    def open(self, calls: list[ToolCallRecord]) -> None:
        self._calls = list(calls)
        self._answered = set()

    def answer(self, block: ToolResultBlock) -> tuple[int, ToolCallRecord]:
        """(position of the call, the call) that `block` answers."""
        for position, call in enumerate(self._calls):
            if call.id == block.tool_use_id:
                if call.id in self._answered:
                    raise InvalidRequest(
                        f"tool_result for tool_use_id {call.id!r} appears more than once"
                    )
                self._answered.add(call.id)
                return position, call
        raise InvalidRequest(
            f"tool_result block names tool_use_id {block.tool_use_id!r}, which does not match "
            "any tool_use block of the previous assistant message"
        )

    def check_all_answered(self) -> None:
        """Before the next assistant turn, every call must have its result."""
        missing = [c.id for c in self._calls if c.id not in self._answered]
        if missing:
            raise InvalidRequest(
                "tool_use ids were found without tool_result blocks immediately after: "
                + ", ".join(missing)
                + ". Each tool_use block must have a corresponding tool_result block"
            )


def _assistant_messages(turn: InputMessage) -> list[ChatMessage]:
    """An assistant turn as chat messages: one, unless it holds web searches the server ran;
    then each search's call and result read as `search_call_messages` renders them for the
    server tool loop (server/web_search.py), so the next turn's prompt matches the one the
    model continued from, and what follows the result is the next assistant message."""
    out: list[ChatMessage] = []
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallRecord] = []
    searches: dict[str, ServerToolUseBlock] = {}

    def message() -> ChatMessage:
        return ChatMessage(
            role="assistant",
            content="".join(texts),
            reasoning="\n".join(reasoning) if reasoning else None,
            tool_calls=list(calls),
        )

    for block in turn.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCallRecord(id=block.id, name=block.name, arguments=block.input))
        elif isinstance(block, ServerToolUseBlock):
            searches[block.id] = block
        elif isinstance(block, WebSearchToolResultBlock):
            call = searches.pop(block.tool_use_id, None)
            if call is None:
                raise InvalidRequest(
                    f"web_search_tool_result names tool_use_id {block.tool_use_id!r}, which "
                    "does not match any server_tool_use block before it in the same message"
                )
            out += search_call_messages(message(), [_search_outcome(call, block)])
            texts, reasoning, calls = [], [], []
        elif isinstance(block, RedactedThinkingBlock):
            continue  # encrypted by another server; nothing a local model can read
        else:
            texts.append(_media_placeholder(block))
    # A server call left without its result (a cut-off answer) has nothing to show the model.
    if texts or reasoning or calls or not out:
        out.append(message())
    return out


def _search_outcome(call: ServerToolUseBlock, result: WebSearchToolResultBlock) -> SearchOutcome:
    """A web search of the history, as the server tool loop had it."""
    query = call.input.get("query")
    query = query if isinstance(query, str) else ""
    if isinstance(result.content, WebSearchErrorPart):
        code = result.content.error_code
        error = code if code in get_args(WebSearchErrorCode) else "unavailable"
        return SearchOutcome(call.id, call.name, query, error=cast(WebSearchErrorCode, error))
    hits = tuple(
        SearchResult(
            url=hit.url,
            title=hit.title,
            snippet=decode_page(hit.encrypted_content),
            page_age=hit.page_age,
        )
        for hit in result.content
    )
    return SearchOutcome(call.id, call.name, query, results=hits)


def _user_messages(
    where: str, turn: InputMessage, calls: _OpenCalls, images: ImageCheck
) -> list[ChatMessage]:
    """A user turn (at `where` in the body): its tool results as tool messages, in the order
    the calls were issued, then its text (and documents) as one user message."""
    results: list[tuple[int, ChatMessage]] = []
    texts: list[str] = []
    for number, block in enumerate(turn.content):
        if isinstance(block, ToolResultBlock):
            position, call = calls.answer(block)
            text = tool_result_text(block.content, images, f"{where}.content.{number}.content")
            results.append(
                (
                    position,
                    ChatMessage(
                        role="tool",
                        content=f"{TOOL_ERROR_MARK}\n{text}" if block.is_error else text,
                        tool_call_id=call.id,
                        name=call.name,
                        is_error=block.is_error,
                    ),
                )
            )
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock):
            image = anthropic_image(f"{where}.content.{number}", block.source, in_tool_result=False)
            texts.append(images.placeholder(image))
        elif isinstance(block, DocumentBlock):
            texts.append(_media_placeholder(block))
        # thinking blocks in a user turn carry nothing the model should see
    out = [message for _, message in sorted(results, key=lambda item: item[0])]
    if texts or not out:
        out.append(ChatMessage(role="user", content=BLOCK_SEPARATOR.join(texts)))
    return out


def tool_result_text(
    parts: Sequence[ToolResultPart], images: ImageCheck | None = None, where: str = ""
) -> str:
    """The text a tool returned (text parts joined; media as placeholders).

    Images inside a tool result become a placeholder even for a text-only model, never a
    400 (`ImageCheck.placeholder`); a vision model's are checked against the limits, `where`
    (the result's `content` field) naming the part that breaks one.
    """
    images = images or ImageCheck(TEXT_ONLY)
    texts = []
    for number, part in enumerate(parts):
        if isinstance(part, TextBlock):
            texts.append(part.text)
        elif isinstance(part, ImageBlock):
            image = anthropic_image(f"{where}.{number}", part.source, in_tool_result=True)
            texts.append(images.placeholder(image))
        else:
            texts.append(_media_placeholder(part))
    return BLOCK_SEPARATOR.join(texts)


def bounded_strings(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A copy of an object schema whose free-form string properties get a `maxLength`.

    Why: Claude Code's title schema is `{title: string}` with no bound. A grammar cannot close
    the JSON by itself when the token budget runs low, so a model that never ends its string
    (any weak or random model) would hit max_tokens with invalid JSON. With at most
    `max_chars` characters, the JSON fits in the capped `max_tokens` (TITLE_MAX_TOKENS allows
    four tokens per character, the worst case of byte-level tokenizers).
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    bounded: dict[str, Any] = {}
    for name, spec in properties.items():
        free = (
            isinstance(spec, dict)
            and spec.get("type") == "string"
            and not {"maxLength", "enum", "const", "pattern", "format"} & spec.keys()
        )
        bounded[name] = {**spec, "maxLength": max_chars} if free else spec
    return {**schema, "properties": bounded}


def _media_placeholder(block: object) -> str:
    # The engine's messages are text-only; keep a marker so the model knows something was there.
    if isinstance(block, DocumentBlock):
        source = block.source
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            title = f"{block.title}\n" if block.title else ""
            return f"{title}{source['data']}"
        return f"[document{': ' + block.title if block.title else ''} omitted]"
    if isinstance(block, ImageBlock):
        return IMAGE_PLACEHOLDER
    return ""


def tool_choice(req: CountTokensRequest) -> ToolChoice:
    """The engine's tool choice; `disable_parallel_tool_use` means at most one call."""
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceNone):
        return ToolChoice(mode="none")
    if isinstance(choice, ToolChoiceTool):
        return ToolChoice(
            mode="tool", name=choice.name, parallel=not choice.disable_parallel_tool_use
        )
    if isinstance(choice, ToolChoiceAny):
        return ToolChoice(mode="any", parallel=not choice.disable_parallel_tool_use)
    if isinstance(choice, ToolChoiceAuto):
        return ToolChoice(mode="auto", parallel=not choice.disable_parallel_tool_use)
    return ToolChoice()


def thinking_settings(req: CountTokensRequest) -> tuple[bool, int | None]:
    """(thinking on?, budget tokens or None). `adaptive` lets the model decide: on, no budget."""
    if isinstance(req.thinking, ThinkingEnabled):
        return True, req.thinking.budget_tokens
    if isinstance(req.thinking, ThinkingAdaptive):
        return True, None
    return False, None


def shows_thinking(req: CountTokensRequest) -> bool:
    """Whether thinking text is sent to the client (`display: omitted` sends only signatures)."""
    if isinstance(req.thinking, ThinkingEnabled | ThinkingAdaptive):
        return req.thinking.display != "omitted"
    return True


def request_kind(req: CountTokensRequest, system_text: str) -> RequestKind:
    """Label a request for stats: Claude Code's session title, main agent, subagent, or other."""
    response_format = req.response_format
    client_tools = [t for t in req.tools or [] if t.is_client_tool]
    if response_format is not None and not client_tools:
        properties = response_format.json_schema.get("properties")
        if isinstance(properties, dict) and "title" in properties:
            return "title"
    if not client_tools:
        return "other"
    if any(marker in system_text for marker in _MAIN_AGENT_MARKERS):
        return "main"
    if any(marker in system_text for marker in _CLAUDE_CODE_MARKERS):
        return "subagent"
    return "other"
