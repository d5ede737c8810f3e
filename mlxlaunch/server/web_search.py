"""The web search server tool, run on this machine: the loop that answers a model's searches.

`ServerToolLoop` stands where a handler's drive loop would call the engine. It passes the
engine's events on; when a round ends in calls of the search tool, it runs each query
through the configured backend (server/search_backends.py), yields a `SearchOutcome` per
call, and continues the generation with the call and its results in the prompt: the loop
Anthropic's API runs, shared by the Messages and the Responses APIs.

How a search and its results read to the model (`search_call_messages`) is one function, used
for the loop's own continuation and for a history that carries them back (server/mapping.py),
so a conversation's next turn renders the same tokens and keeps its cached prefix.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from mlxlaunch.engine.types import (
    Admitted,
    ChatMessage,
    Done,
    EngineEvent,
    GenerationRequest,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallRecord,
    ToolCallStart,
    ToolChoice,
    ToolInputDelta,
    ToolSpec,
    Usage,
)
from mlxlaunch.protocol.responses import WebSearchErrorCode
from mlxlaunch.server.call_arguments import model_arguments
from mlxlaunch.server.search_backends import SearchBackend, SearchFailed, SearchResult
from mlxlaunch.server.settings import ServingEngine

log = logging.getLogger("mlxlaunch.server")

# What a web search call answers while no backend is configured (shown to the user as text).
WEB_SEARCH_NOT_CONFIGURED = (
    "web search is not configured: mlx config set search.backend … "
    "(searxng with search.url, or brave with search.api-key)"
)
SERVER_CALL_PREFIX = "srvtoolu_"
# Rounds of searching one answer may take; the last one may not search again.
MAX_ROUNDS = 8
# Marks the page text we put in `encrypted_content`, so a history's result reads back to it.
_PAGE_MARK = "mlx1:"
# Chat templates have no field for a failed tool call; the result text says so instead
# (client tools' errors too: server/mapping.py).
TOOL_ERROR_MARK = "[tool error]"


# The web search server tool as the model is offered it: the server answers its calls
# (`ServerToolLoop`), so the model may call it whatever the client can run.
WEB_SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
    "required": ["query"],
    "additionalProperties": False,
}


def web_search_spec(name: str) -> ToolSpec:
    """The engine tool that stands for the request's web search server tool."""
    return ToolSpec(
        name=name,
        description="Search the web. Returns result titles, URLs and snippets.",
        parameters=WEB_SEARCH_SCHEMA,
    )


@dataclass(frozen=True)
class WebSearchPolicy:
    """What one request's web search tool allows (its `max_uses` and domain lists)."""

    name: str
    max_uses: int | None = None
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()

    def admits(self, url: str) -> bool:
        """Whether a result at `url` may be shown under the domain lists."""
        host = (urlsplit(url).hostname or "").lower()
        if self.allowed_domains:
            return any(_within(host, domain) for domain in self.allowed_domains)
        return not any(_within(host, domain) for domain in self.blocked_domains)


def _within(host: str, domain: str) -> bool:
    """`host` is `domain` or one of its subdomains (`docs.python.org` within `python.org`)."""
    bare = domain.lower().strip()
    bare = bare.split("://", 1)[-1].split("/", 1)[0].removeprefix("www.")
    host = host.removeprefix("www.")
    return bool(bare) and (host == bare or host.endswith("." + bare))


@dataclass(frozen=True)
class SearchOutcome:
    """A search call answered: its results, or the tool's error code. `call_id` is the
    `srvtoolu_…` id the call went out under."""

    call_id: str
    name: str
    query: str
    results: tuple[SearchResult, ...] = ()
    error: WebSearchErrorCode | None = None

    @property
    def searched(self) -> bool:
        """A search the backend ran (what `web_search_requests` counts)."""
        return self.error is None


# What the drive loop reads from a request: the engine's events and the server's own.
ServedEvent = EngineEvent | SearchOutcome


def encode_page(text: str) -> str:
    """The opaque `encrypted_content` of a result: its page text, readable back by us only."""
    return _PAGE_MARK + base64.b64encode(text.encode()).decode()


def decode_page(content: str) -> str:
    """The page text in one of our `encrypted_content`s ("" for anyone else's)."""
    if not content.startswith(_PAGE_MARK):
        return ""
    try:
        return base64.b64decode(content.removeprefix(_PAGE_MARK), validate=True).decode()
    except ValueError:
        return ""


def results_text(query: str, results: Sequence[SearchResult]) -> str:
    """The tool result the model reads for a search that found `results`."""
    if not results:
        return f'No results for "{query}".'
    lines = [f'Results for "{query}":']
    for number, hit in enumerate(results, 1):
        lines += ["", f"[{number}] {hit.title}", f"URL: {hit.url}"]
        if hit.page_age:
            lines.append(f"Age: {hit.page_age}")
        if hit.snippet:
            lines.append(hit.snippet)
    lines += ["", "Cite the results you use by their URL."]
    return "\n".join(lines)


def error_text(code: WebSearchErrorCode) -> str:
    """The tool result the model reads for a search that failed with `code`."""
    return f"{TOOL_ERROR_MARK}\nweb search failed: {code}"


def search_call_messages(
    assistant: ChatMessage, outcomes: Sequence[SearchOutcome]
) -> list[ChatMessage]:
    """How search calls and their results read to the model: each call an assistant turn
    (the first is `assistant`, with the text written before it) followed by its result as a
    tool message. A history carries them back as blocks in that order, whichever round made
    them, so one shape reads the same from both."""
    out: list[ChatMessage] = []
    for number, outcome in enumerate(outcomes):
        turn = assistant if number == 0 else ChatMessage(role="assistant")
        call = ToolCallRecord(outcome.call_id, outcome.name, {"query": outcome.query})
        out.append(replace(turn, tool_calls=[*turn.tool_calls, call]))
        text = (
            error_text(outcome.error)
            if outcome.error
            else results_text(outcome.query, outcome.results)
        )
        out.append(
            ChatMessage(
                role="tool",
                content=text,
                tool_call_id=outcome.call_id,
                name=outcome.name,
                is_error=outcome.error is not None,
            )
        )
    return out


@dataclass
class _Round:
    """What one engine request of the loop wrote."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)  # engine call id -> srvtoolu_ id
    outcomes: list[SearchOutcome] = field(default_factory=list)  # its search calls answered
    client_calls: int = 0
    done: Done | None = None


def request_runner(
    engine: ServingEngine, policies: dict[str, WebSearchPolicy], backend: SearchBackend | None
) -> ServingEngine | ServerToolLoop:
    """What a request runs on: the engine itself, or, when it offers a search tool (some
    `policies`), the loop that answers the model's searches."""
    return ServerToolLoop(engine, policies, backend) if policies else engine


class ServerToolLoop:
    """The engine, as one request's drive loop sees it, with its web search calls answered.

    Args:
        engine: the engine that generates.
        policies: the request's search tools by name (what the model calls them).
        backend: where queries go; None answers every call `unavailable`, with a text that
            says how to configure one, and ends the answer there.
    """

    def __init__(
        self,
        engine: ServingEngine,
        policies: dict[str, WebSearchPolicy],
        backend: SearchBackend | None,
    ) -> None:
        self._engine = engine
        self._policies = policies
        self._backend = backend
        self._current: str | None = None
        self._cancelled = False
        self._used = 0

    def cancel(self, request_id: str) -> None:
        self._cancelled = True
        if self._current is not None:
            self._engine.cancel(self._current)

    async def submit(self, req: GenerationRequest) -> AsyncIterator[ServedEvent]:
        """The events of `req` and of its continuations, as one answer: one `Admitted` (the
        first round's), the calls under `srvtoolu_` ids, a `SearchOutcome` after each round's
        calls, and one `Done` whose usage sums every round."""
        total = Usage(0)
        current = req
        for number in range(MAX_ROUNDS):
            step = _Round()
            self._current = current.request_id
            events = self._engine.submit(current)
            try:
                async for event in events:
                    if isinstance(event, Done):
                        step.done = event
                        break
                    if isinstance(event, Admitted) and number > 0:
                        continue  # the answer was admitted once; its headers say so
                    event = self._relabel(step, event)
                    yield event
                    if isinstance(event, ToolCallEvent) and event.name in self._policies:
                        # Answered at once, so its result follows its call (as the API's do).
                        outcome = await self._answer(event)
                        step.outcomes.append(outcome)
                        yield outcome
            finally:
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
            done = step.done
            if done is None:
                return  # cancelled: the engine ended without a Done
            total = Usage(
                total.prompt_tokens + done.usage.prompt_tokens,
                total.cached_tokens + done.usage.cached_tokens,
                total.output_tokens + done.usage.output_tokens,
            )
            if not step.outcomes or self._cancelled or number + 1 == MAX_ROUNDS:
                yield replace(done, usage=total)  # the last round: its results end the answer
                return
            if self._backend is None:
                log.warning("web search called, but %s", WEB_SEARCH_NOT_CONFIGURED)
                yield TextDelta(WEB_SEARCH_NOT_CONFIGURED)
                yield replace(done, stop_reason="end_turn", usage=total)
                return
            left = req.max_tokens - total.output_tokens
            if step.client_calls or left <= 0:  # the client runs its calls; or no room left
                reason: StopReason = "tool_use" if left > 0 else "max_tokens"
                yield replace(done, usage=total, stop_reason=reason)
                return
            assistant = ChatMessage(
                role="assistant",
                content="".join(step.text),
                reasoning="".join(step.reasoning) or None,
            )
            current = replace(
                current,
                messages=[*current.messages, *search_call_messages(assistant, step.outcomes)],
                max_tokens=left,
                tool_choice=_next_choice(req.tool_choice, last=number + 2 >= MAX_ROUNDS),
                request_id=f"{req.request_id}-{number + 1}",
            )

    def _relabel(self, step: _Round, event: EngineEvent) -> EngineEvent:
        """`event`, a search call's under its `srvtoolu_` id; what the round wrote noted."""
        if isinstance(event, TextDelta):
            step.text.append(event.text)
        elif isinstance(event, ThinkingDelta):
            step.reasoning.append(event.text)
        elif isinstance(event, ToolCallStart | ToolCallEvent) and event.name in self._policies:
            event = replace(event, id=step.ids.setdefault(event.id, new_server_tool_use_id()))
        elif isinstance(event, ToolInputDelta) and event.id in step.ids:
            event = replace(event, id=step.ids[event.id])
        elif isinstance(event, ToolCallEvent):
            step.client_calls += 1
        return event

    async def _answer(self, call: ToolCallEvent) -> SearchOutcome:
        """The outcome of one search call: the backend's results, or the tool's error."""
        arguments = model_arguments(call.arguments) or {}
        query = arguments.get("query")
        policy = self._policies[call.name]
        if not isinstance(query, str):
            return SearchOutcome(call.id, call.name, "", error="invalid_tool_input")
        if self._backend is None:
            return SearchOutcome(call.id, call.name, query, error="unavailable")
        if policy.max_uses is not None and self._used >= policy.max_uses:
            return SearchOutcome(call.id, call.name, query, error="max_uses_exceeded")
        self._used += 1
        try:
            found = await self._backend.search(query)
        except SearchFailed as exc:
            log.warning("web search %r failed: %s (%s)", query[:80], exc.code, exc.reason)
            return SearchOutcome(call.id, call.name, query, error=exc.code)
        kept = tuple(hit for hit in found if policy.admits(hit.url))
        log.info("web search %r: %d results (%d kept)", query[:80], len(found), len(kept))
        return SearchOutcome(call.id, call.name, query, results=kept)


def _next_choice(choice: ToolChoice, *, last: bool) -> ToolChoice:
    """The continuation's tool choice: a call the request forced has been made, so the model
    now chooses freely; the last round may not call at all (no endless searching)."""
    if last:
        return ToolChoice(mode="none", wire=choice.wire)
    if choice.mode in ("tool", "any"):
        return replace(choice, mode="auto", name=None)
    return choice


def new_server_tool_use_id() -> str:
    """A fresh `srvtoolu_…` id."""
    return SERVER_CALL_PREFIX + secrets.token_hex(12)
