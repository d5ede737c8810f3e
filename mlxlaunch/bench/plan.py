"""The conversations of one benchmark run, built once so every server gets the same ones."""

from __future__ import annotations

from dataclasses import dataclass

from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.prompt import AgentPrompt, claude_code_prompt
from mlxlaunch.bench.workloads import Conversation, agent_session, first_turn, short_chat


@dataclass(frozen=True)
class BenchPlan:
    """Every request the workloads send, in the order they are sent.

    `cold` is the first Claude Code request a fresh server sees; `turns` the agent session;
    `warm` fresh sessions started after it (same system prompt and tools, new conversation).
    """

    prompt: AgentPrompt
    cold: Conversation
    turns: list[Conversation]
    warm: list[Conversation]
    decode: Conversation

    def floor_prompts(self) -> list[tuple[str, Conversation]]:
        """Prompts for the in-process prefill floor, in the servers' order: each one's floor is
        the prefill of what it doesn't share with the one before."""
        return (
            [("cold", self.cold)]
            + [(f"turn {i}", c) for i, c in enumerate(self.turns, start=1)]
            + [(f"warm {i}", c) for i, c in enumerate(self.warm, start=1)]
        )


def build_plan(config: BenchConfig) -> BenchPlan:
    """The conversations for `config`."""
    prompt = claude_code_prompt(quick=config.quick)
    return BenchPlan(
        prompt=prompt,
        cold=first_turn(prompt, "cold"),
        turns=agent_session(prompt, turns=config.turns, tool_result_chars=config.tool_result_chars),
        warm=[first_turn(prompt, f"warm-{i}") for i in range(1, config.warm_sessions + 1)],
        decode=short_chat(0),
    )
