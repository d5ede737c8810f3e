"""The conversations of one benchmark run, built once so every server gets the same ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxlaunch.bench.codex_session import codex_session
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.prompt import AgentPrompt, claude_code_prompt
from mlxlaunch.bench.workloads import (
    Conversation,
    LoopTurn,
    agent_session,
    first_turn,
    short_chat,
    stream_prompt,
    tool_loop_session,
)

# Characters per token of the stream prompts when no tokenizer has measured it: about what
# code-trained BPE vocabularies give on code.
DEFAULT_CHARS_PER_TOKEN = 3.5


@dataclass(frozen=True)
class BenchPlan:
    """Every request the workloads send, in the order they are sent.

    `cold` is the first Claude Code request a fresh server sees; `turns` the agent session;
    `warm` fresh sessions started after it (same system prompt and tools, new conversation);
    `restart` the first turn of a session sent to a restarted server; `streams` the prompts
    of each concurrency level; `tool_loop` the tool-loop session (sent to servers of its own,
    on a model of its own); `codex` the Codex session's request bodies (`/v1/responses`, on
    the same servers as the rest).
    """

    prompt: AgentPrompt
    cold: Conversation
    turns: list[Conversation]
    warm: list[Conversation]
    decode: Conversation
    restart: Conversation | None = None
    streams: dict[int, list[Conversation]] = field(default_factory=dict)
    tool_loop: list[LoopTurn] = field(default_factory=list)
    codex: list[dict[str, Any]] = field(default_factory=list)

    def floor_prompts(self) -> list[tuple[str, Conversation]]:
        """Prompts for the in-process prefill floor, in the servers' order: each one's floor is
        the prefill of what it doesn't share with the one before."""
        return (
            [("cold", self.cold)]
            + [(f"turn {i}", c) for i, c in enumerate(self.turns, start=1)]
            + [(f"warm {i}", c) for i, c in enumerate(self.warm, start=1)]
            + ([("restart", self.restart)] if self.restart is not None else [])
        )


def build_plan(config: BenchConfig, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> BenchPlan:
    """The conversations for `config`; `chars_per_token` (measured with the model's tokenizer)
    sizes the stream prompts to about `config.concurrency_prompt_tokens` tokens."""
    prompt = claude_code_prompt(quick=config.quick)
    stream_chars = max(1, round(config.concurrency_prompt_tokens * chars_per_token))
    return BenchPlan(
        prompt=prompt,
        cold=first_turn(prompt, "cold"),
        turns=agent_session(prompt, turns=config.turns, tool_result_chars=config.tool_result_chars),
        warm=[first_turn(prompt, f"warm-{i}") for i in range(1, config.warm_sessions + 1)],
        decode=short_chat(0),
        restart=first_turn(prompt, "after-restart") if config.restart else None,
        streams={
            level: [stream_prompt(level, i, stream_chars) for i in range(1, level + 1)]
            for level in config.concurrency
        },
        tool_loop=(
            tool_loop_session(prompt, tool_result_chars=config.tool_result_chars)
            if config.tool_loop
            else []
        ),
        codex=(
            codex_session(
                turns=config.turns,
                tool_result_chars=config.tool_result_chars,
                max_output_tokens=config.turn_max_tokens,
            )
            if config.codex_session
            else []
        ),
    )
