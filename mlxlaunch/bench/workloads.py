"""Conversations the benchmark sends: a growing agent session, fresh sessions, short chats.

Conversations are built from the engine's own chat types (`ChatMessage`, `ToolSpec`) and turned
into each server's wire format by `bench.wire`, so both servers get the same messages.
Everything here is deterministic: the same arguments give the same conversation, byte for byte.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mlxlaunch.bench.prompt import AgentPrompt
from mlxlaunch.engine.types import ChatMessage, ToolCallRecord, ToolSpec

PROJECT = "/home/dev/project"

# Words for synthetic tool output: code-like text, so a code tokenizer splits it as it would a
# real file read or grep result.
# fmt: off
_WORDS = (
    "def", "class", "return", "self", "import", "from", "None", "True", "False", "if", "else",
    "for", "in", "while", "with", "as", "try", "except", "raise", "yield", "async", "await",
    "lambda", "request", "response", "engine", "model", "cache", "token", "prefix", "stream",
    "server", "config", "path", "value", "items", "result", "error", "message", "tools",
    "content", "index", "count", "length", "logger", "debug", "info", "warning", "assert",
    "isinstance", "dict", "list", "str", "int", "float", "bool", "len", "range",
)
# fmt: on


@dataclass
class Conversation:
    """One request's worth of conversation: system text, tools and messages."""

    system: str
    tools: tuple[ToolSpec, ...]
    messages: list[ChatMessage] = field(default_factory=list)

    def with_messages(self, *extra: ChatMessage) -> Conversation:
        """A copy with `extra` messages appended (the original is left as it was)."""
        return Conversation(self.system, self.tools, [*self.messages, *extra])


def tool_result_text(turn: int, chars: int) -> str:
    """Deterministic tool output of exactly `chars` characters: numbered lines of code-like text."""
    rng = random.Random(f"tool-result-{turn}")
    lines: list[str] = []
    size = 0
    number = 1
    while size < chars:
        indent = "    " * rng.randint(0, 3)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10)))
        line = f"{number:>6}\t{indent}{words}"
        lines.append(line)
        size += len(line) + 1
        number += 1
    return "\n".join(lines)[:chars]


def tool_call_for_turn(turn: int) -> ToolCallRecord:
    """The assistant's tool call that ends turn `turn`: alternately a Read and a Bash grep."""
    call_id = f"toolu_bench_{turn:03d}"
    if turn % 2:
        return ToolCallRecord(call_id, "Read", {"file_path": f"{PROJECT}/src/module_{turn}.py"})
    return ToolCallRecord(
        call_id,
        "Bash",
        {"command": f"grep -rn 'cache' {PROJECT}/src | head -80", "description": "Search code"},
    )


def first_turn(prompt: AgentPrompt, session: str) -> Conversation:
    """The first request of a session; `session` makes its user turn unique to that session."""
    user = f"{prompt.first_user}\n\nTask for session {session}: read the source and fix the bug."
    return Conversation(prompt.system, prompt.tools, [ChatMessage(role="user", content=user)])


def agent_session(
    prompt: AgentPrompt, *, turns: int, tool_result_chars: int, session: str = "agent"
) -> list[Conversation]:
    """The requests of a growing agent session, one per turn.

    Turn 1 is the first user turn. Every later turn resends everything before it plus one
    assistant tool call and the tool's result of `tool_result_chars` characters — what Claude
    Code sends after each tool round trip.
    """
    if turns < 1:
        raise ValueError("an agent session has at least one turn")
    conversation = first_turn(prompt, session)
    requests = [conversation]
    for turn in range(1, turns):
        call = tool_call_for_turn(turn)
        conversation = conversation.with_messages(
            ChatMessage(role="assistant", content="", tool_calls=[call]),
            ChatMessage(
                role="tool",
                content=tool_result_text(turn, tool_result_chars),
                tool_call_id=call.id,
                name=call.name,
            ),
        )
        requests.append(conversation)
    return requests


def short_chat(index: int) -> Conversation:
    """A short request with no tools, for decode speed and concurrency (prefill is negligible)."""
    return Conversation(
        system="You are a helpful assistant.",
        tools=(),
        messages=[
            ChatMessage(
                role="user",
                content=f"Stream {index}: write a long story about a lighthouse keeper.",
            )
        ],
    )


def stream_prompt(level: int, index: int, chars: int) -> Conversation:
    """The prompt of stream `index` at concurrency `level`: a request about a file of `chars`
    characters, unique to that stream and level (no server can reuse another's prefix)."""
    source = tool_result_text(level * 1000 + index, chars)
    return Conversation(
        system="You are a helpful coding assistant.",
        tools=(),
        messages=[
            ChatMessage(
                role="user",
                content=f"Stream {level}.{index}: explain what this file does.\n\n{source}",
            )
        ],
    )
