"""Codex CLI's rollout (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`) read into its requests.

Each line is `{timestamp, type, payload}`: `session_meta` first (the session's id, working
directory, CLI version, and in some versions the base instructions), then `response_item`s —
exactly the Responses input items Codex resends every turn (developer and user messages,
the model's messages, reasoning and calls, the calls' outputs) — among `turn_context` and
`event_msg` records that are Codex's own. A `compacted` record replaces the history with
its `replacement_history` when it carries one.

Codex sends the whole history each turn (`store: false`), so a request is every item before
a run of the model's own items (what it answered). The tools are not recorded; they come
from the captured request (templates.py), as do the request's settings.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlxlaunch.launch.transcripts.records import (
    RESUME_PLACEHOLDER,
    Transcript,
    TranscriptError,
    TranscriptTurn,
)
from mlxlaunch.launch.transcripts.templates import CODEX_VERSION, codex_template

ROLLOUT_TYPES = frozenset(
    {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
)
# Items the model produces; every other item is input the client adds.
MODEL_ITEMS = frozenset(
    {"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"}
)
FILLED = ("tools", "request settings (reasoning, include, tool_choice)")


def is_codex_record(record: dict[str, Any]) -> bool:
    """Whether `record` looks like a line of a Codex rollout."""
    return record.get("type") in ROLLOUT_TYPES and isinstance(record.get("payload"), dict)


def _is_model_item(item: dict[str, Any]) -> bool:
    if item.get("type") == "message":
        return item.get("role") == "assistant"
    return item.get("type") in MODEL_ITEMS


def history(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's input items in order, a compaction's replacement applied."""
    items: list[dict[str, Any]] = []
    for record in records:
        if not is_codex_record(record):
            continue
        payload = record["payload"]
        if record["type"] == "response_item":
            items.append(copy.deepcopy(payload))
        elif record["type"] == "compacted" and isinstance(payload.get("replacement_history"), list):
            items = [
                copy.deepcopy(i) for i in payload["replacement_history"] if isinstance(i, dict)
            ]
    return items


def _meta(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    for record in records:
        if record.get("type") == "session_meta" and isinstance(record.get("payload"), dict):
            meta: dict[str, Any] = record["payload"]
            return meta
    return {}


def _instructions(meta: dict[str, Any]) -> str | None:
    """The base instructions the session recorded, if it did (versions differ in the key)."""
    base = meta.get("base_instructions")
    if isinstance(base, dict) and isinstance(base.get("text"), str):
        return base["text"]
    if isinstance(base, str):
        return base
    text = meta.get("instructions")
    return text if isinstance(text, str) and text else None


def request_body(
    items: Sequence[dict[str, Any]], *, cwd: str | None, session_id: str, instructions: str | None
) -> dict[str, Any]:
    """A Responses body of `items`, with the captured request's tools and settings."""
    body = codex_template(cwd)
    body["input"] = copy.deepcopy(list(items))
    body["prompt_cache_key"] = session_id
    metadata = body.get("client_metadata")
    if isinstance(metadata, dict):
        metadata.update(session_id=session_id, thread_id=session_id)
    has_developer = any(i.get("role") == "developer" for i in items)
    if instructions and not has_developer:
        body["instructions"] = instructions
    return body


def read_codex(path: Path, records: Sequence[dict[str, Any]]) -> Transcript:
    """The Codex session in `records` (read from `path`)."""
    items = history(records)
    if not any(i.get("type") == "message" and i.get("role") == "user" for i in items):
        raise TranscriptError(path, "no user message in the rollout's response items")
    meta = _meta(records)
    session_id = str(meta.get("id") or path.stem.removeprefix("rollout-"))
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    version = str(meta["cli_version"]) if meta.get("cli_version") else None
    instructions = _instructions(meta)

    def body_of(inputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return request_body(inputs, cwd=cwd, session_id=session_id, instructions=instructions)

    turns = []
    start = None  # index where the current run of the model's items began
    for index, item in enumerate([*items, {"type": "message", "role": "user"}]):
        if _is_model_item(item) and start is None:
            start = index
        elif not _is_model_item(item) and start is not None:
            answer = items[start:index]
            called = tuple(
                str(i.get("name", i.get("type"))) for i in answer if i.get("type") != "message"
            )
            called = tuple(c for c in called if c != "reasoning")
            turns.append(TranscriptTurn(body_of(items[:start]), "responses", called))
            start = None
    pending = items
    if _is_model_item(items[-1]) or items[-1].get("type") != "message":
        pending = [*items, _user_message(RESUME_PLACEHOLDER)]
    return Transcript(
        agent="codex",
        path=path,
        session_id=session_id,
        version=version,
        cwd=cwd,
        turns=tuple(turns),
        resume_body=body_of(pending),
        filled=FILLED,
        template=f"Codex CLI {CODEX_VERSION}",
        lines=tuple(records),
    )


def _user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
