"""What a transcript is read into: the agent, the session, and each request the agent sent.

A turn is one request the model answered, rebuilt as the agent's API carries it (a Messages
body for Claude Code, a Responses body for Codex CLI), plus what the model answered then (its
tool calls' names, for judging a replayed answer). `resume_body` is the request the agent sends
next when the session is resumed, up to where the user's new words begin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlxlaunch.errors import MlxLaunchError

Agent = Literal["claude", "codex"]
Api = Literal["messages", "responses"]
# What the next user message of a resumed session is, before the user types it: the prefix
# cache keeps the conversation up to where this text begins.
RESUME_PLACEHOLDER = "…"


class TranscriptError(MlxLaunchError):
    """A transcript that cannot be read or holds no conversation; `path` names the file."""

    exit_code = 2

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"transcript {path}: {problem}")
        self.path, self.problem = path, problem


@dataclass(frozen=True)
class TranscriptTurn:
    """One request the agent sent and the model answered.

    Args:
        body: the request body, as the agent's API carries it (`api`).
        api: `messages` (POST /v1/messages) or `responses` (POST /v1/responses).
        answered_tools: names of the tools the recorded answer called (empty: text only).
    """

    body: dict[str, Any]
    api: Api
    answered_tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class Transcript:
    """A session as its agent recorded it.

    Args:
        agent: whose transcript it is.
        path: the file.
        session_id: the agent's id of the session.
        version: the agent's version that wrote it, when recorded.
        cwd: the session's working directory, when recorded.
        turns: every request the model answered, in order.
        resume_body: what a resumed session sends first, the new user words left out.
        filled: what the transcript does not record and was taken from the captured
            requests of `template` (system prompt, tools, …), in words.
        template: the agent version whose captured request filled those.
        lines: the file's records as read (redaction writes them back in the same format).
    """

    agent: Agent
    path: Path
    session_id: str
    version: str | None
    cwd: str | None
    turns: tuple[TranscriptTurn, ...]
    resume_body: dict[str, Any]
    filled: tuple[str, ...] = ()
    template: str = ""
    lines: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def api(self) -> Api:
        """The API the agent speaks."""
        return "messages" if self.agent == "claude" else "responses"


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a JSONL file, in order. A line that is not one is skipped: an
    agent appends as it goes, so the last line of a live session may be cut short."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TranscriptError(path, exc.strerror or str(exc)) from None
    return list(_objects(text))


def _objects(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            yield value
