"""Who sent a request, as Claude Code's headers say: its session, and the agent inside it.

Claude Code sends `x-claude-code-session-id` (one id per session) on every request, and, since
2.1.234, `x-claude-code-agent-id` on a subagent's requests (absent on the main loop's). They class
a request more surely than its system prompt does (a user's own `--system-prompt` hides the main
loop's markers; a subagent may be given any prompt), and the session id is the conversation's key
in stats, as `prompt_cache_key` is for Codex.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mlxlaunch.engine.types import RequestKind

SESSION_HEADER = "x-claude-code-session-id"
AGENT_HEADER = "x-claude-code-agent-id"
# Ids are the client's: kept short, so a header cannot grow the stats.
MAX_ID_CHARS = 128


@dataclass(frozen=True)
class AgentHeaders:
    """The session and agent ids a request carried ("" where it carried none)."""

    session_id: str = ""
    agent_id: str = ""

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> AgentHeaders:
        """The ids in `headers` (case-insensitive, as HTTP headers are)."""
        return cls(
            session_id=(headers.get(SESSION_HEADER) or "").strip()[:MAX_ID_CHARS],
            agent_id=(headers.get(AGENT_HEADER) or "").strip()[:MAX_ID_CHARS],
        )

    def classify(self, kind: RequestKind, *, has_tools: bool) -> RequestKind:
        """`kind` as the request's content gave it, corrected by the headers: an agent id is a
        subagent's request, never the main loop's; a Claude Code session's request with tools
        and no agent id is the main loop's, whatever its system prompt. A title stays a title."""
        if kind == "title" or not has_tools:
            return kind
        if self.agent_id:
            return "subagent"
        if self.session_id and kind == "other":
            return "main"
        return kind


NO_AGENT = AgentHeaders()
