"""Claude Code's transcript (`~/.claude/projects/<slug>/<session>.jsonl`) read into its requests.

Each line is a record: `user` and `assistant` ones carry an API `message`; others
(`summary`, `file-history-snapshot`, `system`, `queue-operation`, …) are Claude Code's own
bookkeeping and are not sent (a compaction's boundary is a `system` record that
restarts the chain). Records chain by `parentUuid`; a rewound or resumed session
leaves branches, and the conversation is the chain that ends at the last message, with the
tool results of parallel calls (siblings under one assistant record) taken along. Claude
Code writes one assistant record per content block of a streamed answer, all with the same
`message.id`: they are one assistant turn. Sidechain records (subagents) and synthetic
assistant records (`model: "<synthetic>"`, an API error shown in the UI) are not the main
conversation.

A request is the messages before an assistant turn, inside the parts the transcript leaves
out (templates.py): system prompt, tools, the context prepended to the first user message and
the `# Environment` system turn after it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlxlaunch.launch.transcripts.records import (
    RESUME_PLACEHOLDER,
    Transcript,
    TranscriptError,
    TranscriptTurn,
)
from mlxlaunch.launch.transcripts.templates import CLAUDE_VERSION, claude_template

MESSAGE_TYPES = frozenset({"user", "assistant"})
SYNTHETIC_MODEL = "<synthetic>"
FILLED = (
    "system prompt",
    "tools",
    "context before the first user message",
    "environment system turn",
    "request settings (thinking, max_tokens)",
)


def is_claude_record(record: dict[str, Any]) -> bool:
    """Whether `record` looks like a line of a Claude Code transcript."""
    return (record.get("type") in MESSAGE_TYPES and isinstance(record.get("message"), dict)) or (
        "sessionId" in record and "uuid" in record
    )


def conversation_segments(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The message records of the main conversation, in file order (see the module doc),
    one list per stretch between compactions: a compaction's boundary record starts a new
    chain (`parentUuid` null) and points back with `logicalParentUuid`; what Claude Code sent
    after it starts again from the summary."""
    messages = [r for r in records if _is_main_message(r)]
    if not messages:
        return []
    by_uuid = {r["uuid"]: r for r in records if isinstance(r.get("uuid"), str)}
    chains: list[set[str]] = [set()]
    seen: set[str] = set()
    node: dict[str, Any] | None = messages[-1]
    while node is not None and node["uuid"] not in seen:
        seen.add(node["uuid"])
        chains[-1].add(node["uuid"])
        parent = node.get("parentUuid")
        if parent is None and isinstance(node.get("logicalParentUuid"), str):
            parent = node["logicalParentUuid"]
            chains.append(set())
        node = by_uuid.get(parent) if isinstance(parent, str) else None
    segments = []
    for chain in reversed(chains):
        segment = [
            r
            for r in messages
            if r["uuid"] in chain or (_is_tool_result(r) and r.get("parentUuid") in chain)
        ]
        if segment:
            segments.append(segment)
    return segments


def _is_main_message(record: dict[str, Any]) -> bool:
    message = record.get("message")
    return (
        record.get("type") in MESSAGE_TYPES
        and isinstance(message, dict)
        and not record.get("isSidechain")
        and message.get("model") != SYNTHETIC_MODEL
        and isinstance(record.get("uuid"), str)
    )


def _is_tool_result(record: dict[str, Any]) -> bool:
    content = record["message"].get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Message content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [copy.deepcopy(b) for b in content or [] if isinstance(b, dict)]


def api_messages(records: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], str | None]]:
    """The conversation as API messages, each with the id of the answer it is (assistant
    turns) or None: consecutive user records merge into one user turn, consecutive assistant
    records of one `message.id` into one assistant turn."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for record in records:
        message = record["message"]
        role = message.get("role") or record["type"]
        blocks = _blocks(message.get("content"))
        answer = message.get("id") if role == "assistant" else None
        last = out[-1] if out else None
        if last is not None and last[0]["role"] == role and (role == "user" or last[1] == answer):
            seen = last[0]["content"]
            seen.extend(b for b in blocks if b not in seen)
            continue
        out.append(({"role": role, "content": blocks}, answer))
    return out


def with_template(messages: list[dict[str, Any]], cwd: str | None, session_id: str) -> dict:
    """A request body: the captured request's parts around `messages` (see templates.py)."""
    body = claude_template(cwd)
    captured = body["messages"]
    context = captured[0]["content"][:-1]  # the captured first user turn, less its words
    environment = next((m for m in captured if m["role"] == "system"), None)
    conversation = copy.deepcopy(messages)
    if conversation and conversation[0]["role"] == "user":
        conversation[0]["content"] = [*context, *conversation[0]["content"]]
        if environment is not None:
            conversation.insert(1, environment)
    body["messages"] = conversation
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        user = json.loads(metadata["user_id"])
        user["session_id"] = session_id
        metadata["user_id"] = json.dumps(user, separators=(",", ":"))
    return body


def read_claude(path: Path, records: Sequence[dict[str, Any]]) -> Transcript:
    """The Claude Code session in `records` (read from `path`)."""
    segments = conversation_segments(records)
    if not segments:
        raise TranscriptError(path, "no user or assistant messages of the main conversation")
    first = segments[0][0]
    session_id = str(first.get("sessionId") or path.stem)
    cwd = first.get("cwd") if isinstance(first.get("cwd"), str) else None
    version = next((str(r["version"]) for s in segments for r in s if r.get("version")), None)
    turns = []
    plain: list[dict[str, Any]] = []
    for segment in segments:
        plain = [m for m, _ in api_messages(segment)]
        for index, message in enumerate(plain):
            if message["role"] == "assistant" and index > 0:
                called = tuple(
                    str(b.get("name", ""))
                    for b in message["content"]
                    if b.get("type") == "tool_use"
                )
                body = with_template(plain[:index], cwd, session_id)
                turns.append(TranscriptTurn(body, "messages", called))
    pending = [*plain, {"role": "user", "content": [{"type": "text", "text": RESUME_PLACEHOLDER}]}]
    if plain[-1]["role"] == "user":  # the session ended before the model answered
        pending = plain
    return Transcript(
        agent="claude",
        path=path,
        session_id=session_id,
        version=version,
        cwd=cwd,
        turns=tuple(turns),
        resume_body=with_template(pending, cwd, session_id),
        filled=FILLED,
        template=f"Claude Code {CLAUDE_VERSION}",
        lines=tuple(records),
    )
