"""Conversations the benchmark sends: a growing agent session, fresh sessions, short chats, and
a session of tool loops with thinking, each ended by a new user prompt.

Conversations are built from the engine's own chat types (`ChatMessage`, `ToolSpec`) and turned
into each server's wire format by `bench.wire`, so both servers get the same messages.
Everything here is deterministic: the same arguments give the same conversation, byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

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
    """One request's worth of conversation: system text, tools and messages, whether the
    request asks for thinking (Claude Code does; the other workloads leave it off), its
    temperature (None: the bench's default, `wire.TEMPERATURE`) and the model id an agent
    would send with it (None: the bench's own; the haiku tier's id picks our small model)."""

    system: str
    tools: tuple[ToolSpec, ...]
    messages: list[ChatMessage] = field(default_factory=list)
    thinking: bool = False
    temperature: float | None = None
    model: str | None = None

    def with_messages(self, *extra: ChatMessage) -> Conversation:
        """A copy with `extra` messages appended (the original is left as it was)."""
        return replace(self, messages=[*self.messages, *extra])


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
    return _one_question(
        "You are a helpful assistant.",
        f"Stream {index}: write a long story about a lighthouse keeper.",
    )


def stream_prompt(level: int, index: int, chars: int) -> Conversation:
    """The prompt of stream `index` at concurrency `level`: a request about a file of `chars`
    characters, unique to that stream and level (no server can reuse another's prefix)."""
    source = tool_result_text(level * 1000 + index, chars)
    return _one_question(
        _CODING_SYSTEM, f"Stream {level}.{index}: explain what this file does.\n\n{source}"
    )


def file_rewrite(file_text: str, level: int, index: int) -> Conversation:
    """Stream `index` at `level` of the copy workload: a file in the prompt and "Rewrite it."
    — what an agent's Write of a file it just read asks of the model. Greedy, so every server
    writes the same reply; the stream's own first line keeps prompts apart."""
    request = (
        f"Stream {level}.{index}: here is {PROJECT}/src/module.py:\n\n{file_text}\n\nRewrite it."
    )
    return _one_question(_CODING_SYSTEM, request, temperature=0.0)


_CODING_SYSTEM = "You are a helpful coding assistant."


def _one_question(system: str, question: str, *, temperature: float | None = None) -> Conversation:
    """A request of one user message and no tools."""
    return Conversation(
        system=system,
        tools=(),
        messages=[ChatMessage(role="user", content=question)],
        temperature=temperature,
    )


# --- the tool loop: new user prompts after loops of tool rounds, with thinking ----------------

TurnKind = Literal["first prompt", "tool round", "new prompt"]
TURN_KINDS: tuple[TurnKind, ...] = ("first prompt", "tool round", "new prompt")
# Tool rounds before each new user prompt: the session is prompt, 3 rounds, new prompt, 2
# rounds, new prompt.
LOOP_ROUNDS = (3, 2)

# The assistant's side, scripted: servers are compared on the same prompts, so no turn is ever
# the model's own output. Thinking as Claude Code's model writes it before a call: a few
# sentences on what it knows and why it calls this tool next.
_CALL_THINKING = {
    "Read": (
        "The report says entries come back stale after a file is edited. Before changing "
        "anything I want to see how {path} builds its cache keys and when it evicts them, so "
        "I will read the whole file first and note every place a key is made."
    ),
    "Bash": (
        "Reading one module is not enough: every caller of the cache has to agree on the key. "
        "A grep over src/ lists where keys are built and where entries are dropped, and the "
        "fix must cover all of them, so I will search before I edit."
    ),
}
# Per loop: the thinking and text of the answer that ends it, then the user's next prompt.
_ANSWERS = (
    (
        "The reads agree: keys ignore the file's modification time, so an edited file hits "
        "the old entry. Adding the mtime to the key fixes it at both call sites. Tell the "
        "user what changed and where.",
        "Fixed: cache keys now include the file's modification time, so an edited file is "
        "read again instead of served from the stale entry. The change is in "
        "`src/module_1.py` and `src/module_3.py`.",
        "Thanks. Now add a test that edits a file between two reads and checks that the "
        "second read sees the edit.",
    ),
    (
        "Both call sites pass the mtime now and the new test edits a file between two reads. "
        "It fails without the fix and passes with it. Summarise that for the user.",
        "Added `test_edit_invalidates_entry`: it reads a file, edits it, reads it again and "
        "checks that the second read sees the edit. It fails without the fix and passes "
        "with it.",
        "Good. Last thing: add a line about the fix to the changelog.",
    ),
)


@dataclass(frozen=True)
class LoopTurn:
    """One request of the tool loop and the kind of turn it is: the first prompt, a tool
    round (the request after a tool result) or a new prompt (after the assistant's answer)."""

    kind: TurnKind
    conversation: Conversation


def call_thinking(call: ToolCallRecord) -> str:
    """The scripted thinking before `call`."""
    path = call.arguments.get("file_path", "the module")
    return _CALL_THINKING[call.name].format(path=path)


def tool_loop_session(
    prompt: AgentPrompt, *, tool_result_chars: int, rounds: Sequence[int] = LOOP_ROUNDS
) -> list[LoopTurn]:
    """The requests of a Claude Code session of tool loops, thinking on, one per turn.

    The first user prompt, then for each count in `rounds`: that many tool rounds (an
    assistant turn with thinking and one tool call, then its result of `tool_result_chars`
    characters), the assistant's answer (thinking and text) and a new user prompt. Every
    request resends everything before it, as Claude Code does.
    """
    if not 1 <= len(rounds) <= len(_ANSWERS) or min(rounds) < 1:
        raise ValueError(f"a tool loop has 1 to {len(_ANSWERS)} loops of at least one round")
    first = first_turn(prompt, "tool-loop")
    conversation = Conversation(first.system, first.tools, first.messages, thinking=True)
    turns = [LoopTurn("first prompt", conversation)]
    number = 0
    for count, (thinking, answer, next_prompt) in zip(rounds, _ANSWERS, strict=False):
        for _ in range(count):
            number += 1
            call = tool_call_for_turn(number)
            conversation = conversation.with_messages(
                ChatMessage(
                    role="assistant", content="", reasoning=call_thinking(call), tool_calls=[call]
                ),
                ChatMessage(
                    role="tool",
                    content=tool_result_text(number, tool_result_chars),
                    tool_call_id=call.id,
                    name=call.name,
                ),
            )
            turns.append(LoopTurn("tool round", conversation))
        conversation = conversation.with_messages(
            ChatMessage(role="assistant", content=answer, reasoning=thinking),
            ChatMessage(role="user", content=next_prompt),
        )
        turns.append(LoopTurn("new prompt", conversation))
    return turns
