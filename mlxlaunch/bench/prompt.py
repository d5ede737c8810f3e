"""The Claude Code prompt the benchmark replays: system prompt, tools and first user turn.

A copy of the captured request ships in `data/` so `mlx bench` works from an installed wheel.
The billing-header block is already gone from the copy (servers strip it; it changes per
conversation), and the mid-conversation environment `system` turn is folded into the first user
turn, because not every chat template accepts a `system` message after the first position and
both servers must see the same conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from mlxlaunch.engine.types import ToolSpec

CAPTURE = "claude_code_2.1.332.json"

# --quick keeps a head of the system prompt and the few tools the session calls, so the whole
# benchmark runs in under a minute with a tiny model on two cores.
QUICK_SYSTEM_CHARS = 2_000
QUICK_TOOLS = ("Bash", "Read", "Edit")
QUICK_DESCRIPTION_CHARS = 300


@dataclass(frozen=True)
class AgentPrompt:
    """What every Claude Code request starts with: system text, tools, the first user turn."""

    system: str
    tools: tuple[ToolSpec, ...]
    first_user: str
    source: str


@cache
def _capture() -> dict[str, Any]:
    text = resources.files("mlxlaunch.bench.data").joinpath(CAPTURE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def claude_code_prompt(*, quick: bool = False) -> AgentPrompt:
    """The captured Claude Code prompt; `quick` gives a shortened one with three tools."""
    data = _capture()
    system = "\n\n".join(data["system"])
    tools = [
        ToolSpec(name=t["name"], description=t["description"], parameters=t["input_schema"])
        for t in data["tools"]
    ]
    first_user = (
        "\n".join(data["first_user"])
        + "\n\n<system-reminder>\n"
        + data["environment"]
        + "\n</system-reminder>"
    )
    if quick:
        system = system[:QUICK_SYSTEM_CHARS]
        tools = [
            ToolSpec(t.name, t.description[:QUICK_DESCRIPTION_CHARS], t.parameters)
            for t in tools
            if t.name in QUICK_TOOLS
        ]
        first_user = "\n".join(data["first_user"])[:QUICK_DESCRIPTION_CHARS]
    return AgentPrompt(
        system=system, tools=tuple(tools), first_user=first_user, source=data["source"]
    )
