"""Agent transcripts written in the agents' own formats, for the replay and resume tests.

`claude_session` writes what Claude Code 2.1.332 keeps in `~/.claude/projects/<slug>/`: one
record per line, chained by `parentUuid`, one assistant record per content block of an
answer (same `message.id`), tool results with Claude Code's `toolUseResult` copy, a
`file-history-snapshot` and a `summary` line; a compaction (`compact_at`) is a
`compact_boundary` system record with `logicalParentUuid` and a summary user record.
`codex_rollout` writes a Codex CLI 0.171.0 rollout (`session_meta`, `response_item`s among
`turn_context` and `event_msg` records). The static fixtures in `fixtures/transcripts/` add
rewinds, parallel calls, subagent and synthetic records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlxlaunch.bench.workloads import tool_result_text

CLAUDE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"


def claude_project_slug(cwd: str) -> str:
    """The directory name Claude Code gives a project: every non-alphanumeric a dash."""
    return "".join(c if c.isalnum() else "-" for c in cwd)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    path.write_text(text, encoding="utf-8")
    return path


def claude_session(
    session_id: str,
    cwd: str,
    *,
    turns: int,
    tool_result_chars: int = 600,
    compact_at: int | None = None,
) -> list[dict[str, Any]]:
    """A Claude Code session of `turns` model answers: a user prompt, then `turns - 1` tool
    rounds (a Read or a Bash call and its result), then a closing text answer."""
    base = {"isSidechain": False, "userType": "external", "cwd": cwd, "sessionId": session_id,
            "version": CLAUDE_VERSION, "gitBranch": "main"}  # fmt: skip
    records: list[dict[str, Any]] = []
    counter = iter(range(1, 1_000_000))

    def uid() -> str:
        return f"00000000-0000-4000-8000-{next(counter):012d}"

    def stamp() -> str:
        n = len(records)
        return f"2026-12-01T09:{n // 60 % 60:02d}:{n % 60:02d}.000Z"

    def user(parent: str | None, content: Any, **extra: Any) -> str:
        u = uid()
        records.append({"parentUuid": parent, **base, "type": "user",
                        "message": {"role": "user", "content": content}, "uuid": u,
                        "timestamp": stamp(), **extra})  # fmt: skip
        return u

    def assistant(parent: str, message_id: str, block: dict[str, Any]) -> str:
        u = uid()
        records.append({"parentUuid": parent, **base,
                        "message": {"id": message_id, "type": "message", "role": "assistant",
                                    "model": "claude-sonnet-4-5", "content": [block],
                                    "stop_reason": None, "usage": {"input_tokens": 4,
                                                                   "output_tokens": 30}},
                        "requestId": f"req_{message_id}", "type": "assistant", "uuid": u,
                        "timestamp": stamp()})  # fmt: skip
        return u

    records.append({"type": "file-history-snapshot", "messageId": "snap", "snapshot": {},
                    "isSnapshotUpdate": False})  # fmt: skip
    last = user(None, "Find why the cache returns stale entries after an edit, and fix it.")
    for turn in range(1, turns):
        message_id = f"msg_{session_id[:8]}_{turn:03d}"
        last = assistant(last, message_id, {"type": "text", "text": f"Step {turn}: looking."})
        call_id = f"toolu_{session_id[:8]}_{turn:03d}"
        if turn % 2:
            call = {"type": "tool_use", "id": call_id, "name": "Read",
                    "input": {"file_path": f"{cwd}/src/module_{turn}.py"}}  # fmt: skip
        else:
            command = {"command": "grep -rn cache src", "description": "Search"}
            call = {"type": "tool_use", "id": call_id, "name": "Bash", "input": command}
        last = assistant(last, message_id, call)
        output = tool_result_text(turn, tool_result_chars)
        result = {"tool_use_id": call_id, "type": "tool_result", "content": output}
        copy = {"stdout": output, "stderr": "", "interrupted": False}
        last = user(last, [result], toolUseResult=copy)
        if compact_at is not None and turn == compact_at:
            boundary = uid()
            records.append({"parentUuid": None, "logicalParentUuid": last, **base,
                            "type": "system", "subtype": "compact_boundary",
                            "content": "Conversation compacted", "isMeta": False,
                            "uuid": boundary, "timestamp": stamp(),
                            "compactMetadata": {"trigger": "auto"}})  # fmt: skip
            last = user(boundary, "This session is being continued from a previous "
                        "conversation that ran out of context. Summary: the cache key "
                        "ignores mtime.", isCompactSummary=True)  # fmt: skip
    last = assistant(last, f"msg_{session_id[:8]}_end",
                     {"type": "text", "text": "Fixed: keys now include the mtime."})  # fmt: skip
    records.append({"type": "summary", "summary": "Fix stale cache", "leafUuid": last})
    return records


def write_claude_session(home: Path, cwd: str, session_id: str, **options: Any) -> Path:
    """The session written where Claude Code keeps it under `home`."""
    path = home / ".claude" / "projects" / claude_project_slug(cwd) / f"{session_id}.jsonl"
    return write_jsonl(path, claude_session(session_id, cwd, **options))


def codex_rollout(
    session_id: str, cwd: str, *, turns: int, tool_result_chars: int = 600
) -> list[dict[str, Any]]:
    """A Codex session of `turns` model answers: `turns - 1` exec_command rounds after the
    user's prompt, then a closing message."""
    records: list[dict[str, Any]] = []

    def record(kind: str, payload: dict[str, Any]) -> None:
        n = len(records)
        stamp = f"2026-12-01T10:{n // 60 % 60:02d}:{n % 60:02d}.000Z"
        records.append({"timestamp": stamp, "type": kind, "payload": payload})

    def message(role: str, text: str) -> dict[str, Any]:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    record("session_meta", {"id": session_id, "timestamp": "2026-12-01T10:00:00.000Z",
                            "cwd": cwd, "originator": "codex_cli_rs",
                            "cli_version": CODEX_VERSION, "source": "cli"})  # fmt: skip
    record("response_item", message("developer", "You are a coding agent running in the "
                                    "Codex CLI. Be precise, safe, and helpful."))  # fmt: skip
    env = (
        f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n</environment_context>"
    )
    record("response_item", message("user", env))
    record("turn_context", {"cwd": cwd, "approval_policy": "on-request", "model": "local"})
    record("response_item", message("user", "Find why the cache returns stale entries."))
    record("event_msg", {"type": "user_message", "message": "Find why…", "kind": "plain"})
    for turn in range(1, turns):
        call_id = f"call_{turn:04d}"
        record("response_item", {"type": "function_call", "name": "exec_command",
                                 "arguments": json.dumps({"cmd": f"sed -n 1,80p m{turn}.py"}),
                                 "call_id": call_id})  # fmt: skip
        output = "Process exited with code 0\nOutput:\n" + tool_result_text(turn, tool_result_chars)
        record("response_item", {"type": "function_call_output", "call_id": call_id,
                                 "output": output})  # fmt: skip
        record("event_msg", {"type": "token_count", "info": None})
    record("response_item", message("assistant", "Fixed: keys now include the mtime."))
    return records


def write_codex_rollout(home: Path, session_id: str, cwd: str, **options: Any) -> Path:
    """The rollout written where Codex keeps it under `home` (`.codex/sessions/Y/M/D/`)."""
    name = f"rollout-2026-12-01T10-00-00-{session_id}.jsonl"
    path = home / ".codex" / "sessions" / "2026" / "12" / "01" / name
    return write_jsonl(path, codex_rollout(session_id, cwd, **options))
