"""Prompt rendering: engine messages and tools through the model's chat template to token ids.

Rendering is deterministic: the same request always gives the same tokens (what the prefix
cache relies on), so nothing here iterates sets or adds per-call data.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.prompt.incremental import IncrementalTokenizer
from mlxlaunch.engine.prompt.system_turns import SystemTurns
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt: its token ids and whether it ends inside an open think span."""

    tokens: list[int]
    opens_thinking: bool


def message_to_template(message: ChatMessage) -> dict[str, Any]:
    """One engine message as the dict chat templates expect (the Hugging Face shape)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant":
        if message.reasoning:
            out["reasoning_content"] = message.reasoning
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ]
    elif message.role == "tool":
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
    return out


def tool_to_template(tool: ToolSpec) -> dict[str, Any]:
    """One tool in the OpenAI-style function shape chat templates iterate over."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


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

    def __init__(self, tokenizer: TokenizerWrapper, lock: threading.Lock | None = None) -> None:
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()
        self.system_turns = SystemTurns(tokenizer)  # mid-conversation system turns, in place
        self.encoder = IncrementalTokenizer(tokenizer)

    def render_text(self, request: GenerationRequest) -> str:
        """The prompt text: chat template applied, generation prompt added."""
        tools = [tool_to_template(t) for t in request.tools] or None
        with self.lock:
            placed = self.system_turns.place(request.messages)  # may probe the template
            messages = [message_to_template(m) for m in placed]
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=True,
                enable_thinking=request.thinking,
                tokenize=False,
            )
        return str(text)

    def render(self, request: GenerationRequest) -> RenderedPrompt:
        """Render and tokenize once; the template already holds any BOS it wants."""
        text = self.render_text(request)
        with self.lock:
            tokens = self.encoder.encode(text)
        # Some templates open a think span even with thinking off; the parser must know either way.
        opens = ends_inside_span(text, self.tokenizer.think_start, self.tokenizer.think_end)
        return RenderedPrompt(tokens=tokens, opens_thinking=opens)

    def warm(self, token_sequences: Iterable[Sequence[int]] = ()) -> int:
        """Get ready for the first request while nothing waits: compile the chat template
        (and probe it for system turns) on a tiny conversation, and remember the texts of
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
