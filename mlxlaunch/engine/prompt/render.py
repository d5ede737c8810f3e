"""Prompt rendering: engine messages and tools through the model's chat template to token ids.

Before the template runs, the conversation is reshaped for what this template renders
faithfully (`template_behaviour` probes it once, `conversation` rewrites), and tool
definitions the template would ignore go into the system prompt (`tool_definitions`).

Rendering is deterministic: the same request always gives the same tokens (what the prefix
cache relies on), so nothing here iterates sets or adds per-call data. In the default "stable"
render mode, a template that re-renders a conversation's past differently as it grows is kept
from doing so (`stable`), and a template that prints today's date prints a pinned one
(`render_date`); "exact" renders what the template renders.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.config import RENDER_MODES, RenderMode
from mlxlaunch.engine.prompt.conversation import adapt_conversation
from mlxlaunch.engine.prompt.incremental import IncrementalTokenizer
from mlxlaunch.engine.prompt.prompt_size import too_long_at_least
from mlxlaunch.engine.prompt.render_date import clock_arguments
from mlxlaunch.engine.prompt.stable import StableRenderer
from mlxlaunch.engine.prompt.template_behaviour import probe_template
from mlxlaunch.engine.prompt.template_modes import TemplateBehaviour
from mlxlaunch.engine.prompt.template_shape import message_to_template, tool_to_template
from mlxlaunch.engine.prompt.tool_definitions import tool_section, with_tool_section
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, PromptTooLong
from mlxlaunch.store.dialects import Dialect, detect_dialect

__all__ = [
    "RENDER_MODES",
    "PromptRenderer",
    "RenderMode",
    "RenderedPrompt",
    "ends_inside_span",
    "message_to_template",
    "tool_to_template",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt: its token ids and whether it ends inside an open think span."""

    tokens: list[int]
    opens_thinking: bool
    # A vision model's prepared images (runtime/vision.py), held while the prompt lives: the
    # model embeds their ids from them.
    images: tuple[Any, ...] = ()


def ends_inside_span(text: str, start: str | None, end: str | None) -> bool:
    """Whether `text` opened a `start` … `end` span that it did not close."""
    if not start or not end:
        return False
    opened = text.rfind(start)
    return opened >= 0 and text.rfind(end) < opened


class PromptRenderer:
    """Renders and tokenizes requests for one tokenizer.

    Tokenizers are not assumed to be safe to share across threads, so every use of the
    tokenizer here holds `lock` (which the engine also holds around its own tokenizer calls).
    Prompts are tokenized incrementally: a prompt that continues a recent one reuses its token
    ids up to the last special token they share (see `incremental`).
    """

    def __init__(
        self,
        tokenizer: TokenizerWrapper,
        lock: threading.Lock | None = None,
        dialect: Dialect | None = None,
        *,
        render_mode: RenderMode = "stable",
        pinned_date: datetime.date | None = None,
    ) -> None:
        """`dialect`: the model's tool-call dialect (its id style decides the form of call
        ids); None: detected from the chat template and vocabulary on first use.
        `render_mode`: "stable" (each prompt extends the previous one, see `stable`) or
        "exact" (the template's own output). `pinned_date`: the date a template that prints
        today's date prints in stable mode (None: today's, at construction)."""
        if render_mode not in RENDER_MODES:
            raise ValueError(f"render mode must be one of {', '.join(RENDER_MODES)}")
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()
        self.dialect = dialect
        self._dialect_given = dialect is not None
        self.encoder = IncrementalTokenizer(tokenizer)
        self._behaviour: TemplateBehaviour | None = None
        self._probed_template: object = None  # the template `_behaviour` was probed on
        self._warned_tools = False
        self._warned_text = False
        self.render_mode: RenderMode = render_mode
        self.pinned_date = pinned_date or datetime.date.today()
        self.stable = StableRenderer()
        self._clock: dict[str, Any] | None = None  # template arguments pinning the date
        self._clock_template: object = None  # the template `_clock` was probed on
        self._context = ""  # a digest of the template and `_clock`, for the stable memo

    @property
    def behaviour(self) -> TemplateBehaviour:
        """What the chat template renders faithfully (probed on first use; hold `lock`)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if self._behaviour is None or template != self._probed_template:
            if not self._dialect_given:
                self.dialect = _detected_dialect(self.tokenizer, template)
            style = self.dialect.id_style if self.dialect is not None else "any"
            self._behaviour = probe_template(self._apply, style)
            self._probed_template = template
            log.debug("chat template behaviour: %s", self._behaviour)
        return self._behaviour

    @property
    def clock_arguments(self) -> dict[str, Any]:
        """Template arguments that pin the date the template prints in stable mode ({} where
        it prints none; probed on first use; hold `lock`)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if self._clock is None or template != self._clock_template:
            self._clock = clock_arguments(
                template, self._call, self.pinned_date, datetime.date.today()
            )
            self._clock_template = template
            self._context = hashlib.blake2b(
                json.dumps([template, sorted(self._clock)], default=str).encode()
            ).hexdigest()
        return self._clock

    def render_text(
        self, request: GenerationRequest, memoized: list[tuple[str, bytes]] | None = None
    ) -> str:
        """The prompt text: conversation adapted to the template, chat template applied
        (cache-stably in "stable" mode), generation prompt added. `memoized` receives the
        keys of what the stable render memoized (see `StableRenderer.forget`)."""
        with self.lock:
            shaped, tools = self.template_messages(request)
            if self.render_mode == "exact":
                return self._template(shaped, tools, True, request.thinking)
            clock = self.clock_arguments
            render = partial(self._template, thinking=request.thinking, arguments=clock)
            # The memo's key: everything a render depends on beyond messages and tools.
            context = f"{self._context}/{request.thinking}/{self.pinned_date.isoformat()}"
            return self.stable.render(shaped, tools, render, context, memoized)

    def template_messages(
        self, request: GenerationRequest
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The conversation and tools as the chat template receives them: adapted to what it
        renders faithfully, in its dict shape (hold `lock`: may probe the template)."""
        behaviour = self.behaviour
        messages = self._messages(request, behaviour)
        shaped = [message_to_template(m, behaviour.reasoning_field) for m in messages]
        if not behaviour.tools_accepted:  # they are in the system prompt (`_messages`)
            return shaped, None
        return shaped, [tool_to_template(t) for t in request.tools] or None

    def _template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        generation: bool,
        thinking: bool,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        return self._with_tools(messages, tools, generation, arguments, enable_thinking=thinking)

    def _call(self, messages: list[dict[str, Any]], arguments: dict[str, Any]) -> str:
        return self._with_tools(messages, None, True, arguments)

    def _with_tools(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        generation: bool,
        arguments: dict[str, Any] | None,
        **switches: Any,
    ) -> str:
        """The chat template's text for `messages`, with the tool list as this model takes it."""
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tools=self._tool_list(tools),
                add_generation_prompt=generation,
                tokenize=False,
                **switches,
                **(arguments or {}),
            )
        )

    def _tool_list(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """`tools` as the template takes them: a template that fails without a list gets an
        empty one (the behaviour's `empty_tools`)."""
        needs_list = self._behaviour is not None and self._behaviour.empty_tools
        return [] if tools is None and needs_list else tools

    def _messages(
        self, request: GenerationRequest, behaviour: TemplateBehaviour
    ) -> list[ChatMessage]:
        messages = request.messages
        if request.tools and not behaviour.tools_rendered:
            name = self.dialect.name if self.dialect is not None else None
            section, form = tool_section(request.tools, name, behaviour.call_example)
            messages = with_tool_section(messages, section)
            if not self._warned_tools:
                self._warned_tools = True
                log.warning(
                    "this model's chat template ignores tool definitions; the %d tools are "
                    "written into the system prompt instead (%s)",
                    len(request.tools),
                    form,
                )
        dropped = behaviour.text_with_call == "dropped" and not self._warned_text
        if dropped and any(m.tool_calls and m.content.strip() for m in messages):
            self._warned_text = True
            log.warning(
                "this model's chat template drops an assistant's text in turns that call "
                "tools, and no rewrite it accepts keeps it; such text is not in the prompt"
            )
        return adapt_conversation(messages, behaviour)

    def _apply(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation, tokenize=False
            )
        )

    def render(
        self, request: GenerationRequest, limit: int | None = None, *, exact: bool = False
    ) -> RenderedPrompt:
        """Render and tokenize once; the template already holds any BOS it wants.

        With `limit` (the context window), a prompt of `limit` tokens or more raises
        PromptTooLong, in work bounded by `limit` rather than by the prompt: before rendering
        when the text every template writes out (system, user and tool messages) already
        holds that many tokens, before tokenizing when the rendered text does (see
        prompt_size), else after tokenizing. What it memoized is forgotten then. `exact`:
        a prompt tokenized in full is returned whatever its length (counting tokens)."""
        if limit is not None:
            self._refuse_beyond(limit, rendered_texts(request))
        memoized: list[tuple[str, bytes]] = []
        text = self.render_text(request, memoized)
        try:
            if limit is not None:
                self._refuse_beyond(limit, [text])
            with self.lock:
                tokens = self.encoder.encode(text)
            if limit is not None and not exact and len(tokens) >= limit:
                with self.lock:
                    self.encoder.forget_text(text)
                raise PromptTooLong(len(tokens), limit)
        except PromptTooLong:
            with self.lock:
                self.stable.forget(memoized)
            raise
        # Some templates open a think span even with thinking off; the parser must know either way.
        start, end = self.tokenizer.think_start, self.tokenizer.think_end
        if start is None and self.dialect is not None:  # markers mlx-lm does not know
            start, end = self.dialect.think_start, self.dialect.think_end
        opens = ends_inside_span(text, start, end)
        return RenderedPrompt(tokens=tokens, opens_thinking=opens)

    def _refuse_beyond(self, limit: int, texts: list[str]) -> None:
        """Raise PromptTooLong where `texts` certainly hold `limit` tokens or more."""
        bound = too_long_at_least(texts, self._count, limit)
        if bound is not None:
            raise PromptTooLong(bound, limit)

    def _count(self, piece: str) -> int:
        with self.lock:  # per piece: other requests' tokenizing goes on in between
            return self.encoder.count(piece)

    def adopt(self, token_ids: Sequence[int]) -> bool:
        """A finished request's prompt and reply, as the model wrote it: the next turn's
        prompt reuses these ids where it renders the same text (see
        `IncrementalTokenizer.adopt`). Only an optimisation: a failure keeps nothing."""
        try:
            with self.lock:
                return self.encoder.adopt(token_ids)
        except Exception as exc:
            log.warning("prompt renderer: a reply's tokens were not kept (%s)", exc)
            return False

    def warm(self, token_sequences: Iterable[Sequence[int]] = ()) -> int:
        """Get ready for the first request while nothing waits: compile the chat template
        (and probe what it renders) on a tiny conversation, and remember the texts of
        `token_sequences` (prefixes restored from the disk cache) so the first prompt that
        continues one is tokenized incrementally. Returns how many were remembered.

        Only an optimisation: a failure is logged and the first request does the work."""
        try:
            hello = [ChatMessage(role="user", content="hi")]
            self.render_text(GenerationRequest(messages=hello, max_tokens=1))
            with self.lock:
                return self.encoder.prime(token_sequences)
        except Exception as exc:
            log.warning("prompt renderer warm-up skipped: %s", exc)
            return 0


def rendered_texts(request: GenerationRequest) -> list[str]:
    """The texts of `request` that every chat template writes into the prompt whole (or
    trimmed): system, user and tool messages' content. Not assistant turns: templates drop
    their reasoning, or text before a think end, or text beside calls."""
    return [m.content for m in request.messages if m.role != "assistant" and m.content]


def _detected_dialect(tokenizer: Any, template: object) -> Dialect | None:
    """The dialect read from the template and vocabulary (None where neither says)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer double without a vocabulary
        vocab = {}
    return detect_dialect(template if isinstance(template, str) else None, vocab)
