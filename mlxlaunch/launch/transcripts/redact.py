"""A transcript with every text replaced by filler of the same token count, to share a replay.

Every piece of the session's own text (the user's words, the model's answers and thinking,
tool arguments' string values, tool output, instructions, the working directory) becomes
filler words that the served model's tokenizer counts as many tokens as the original, so a
replay of the redacted file prefills and reuses as the original does. Equal texts get equal
filler (a file read twice stays a repeat); structure stays: roles, tool names, call ids,
argument keys, the records' chain. What only the agent reads (Claude Code's `toolUseResult`
copies of file contents, todos, snapshots, summaries; Codex's `event_msg` and
`turn_context`) is left out. The result is written in the agent's own format.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from mlxlaunch.launch.transcripts.records import Transcript

# Counts the tokens of a text (the served model's tokenizer, no special tokens).
TokenCount = Callable[[str], int]

# fmt: off
FILLER = (
    "alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike",
    "oscar", "papa", "romeo", "sierra", "tango", "victor", "whiskey", "yankee", "zulu", "apple",
    "river", "stone", "cloud", "green", "table", "paper", "water", "light", "north", "south",
    "the", "of", "and", "to", "in", "is", "it", "on", "at", "as", "be", "by", "we", "or",
    *"abcdefghijklmnoprstuvwxyz",
)
# fmt: on
REDACTED_CWD = "/redacted/project"
# Attempts at matching the count before settling on the nearest filler that is not longer.
_ROUNDS = 12
# Claude Code record fields a replay reads; every other field is left out.
_CLAUDE_KEPT = ("parentUuid", "isSidechain", "userType", "sessionId", "version", "type", "uuid",
                "timestamp", "requestId", "isMeta")  # fmt: skip
_MESSAGE_KEPT = ("id", "type", "role", "model", "stop_reason")


class Redactor:
    """Replaces texts with filler of the same token count (`count`), remembering each."""

    def __init__(self, count: TokenCount) -> None:
        self.count = count
        self.seen: dict[str, str] = {}
        self.inexact = 0  # texts whose filler is shorter than they are (no exact count found)
        self._units: tuple[str, ...] | None = None

    @property
    def units(self) -> tuple[str, ...]:
        """The filler words this tokenizer counts as one token, alone and after a space
        (all of FILLER if none is: the count is then matched by trying)."""
        if self._units is None:
            ones = tuple(w for w in FILLER if self.count(w) == 1 and self.count(f"{w} {w}") == 2)
            self._units = ones or FILLER
        return self._units

    def text(self, text: str) -> str:
        """Filler for `text` with as many tokens (the same filler for the same text)."""
        if not text.strip():
            return text
        if text not in self.seen:
            self.seen[text] = self._filler(text)
        return self.seen[text]

    def _filler(self, text: str) -> str:
        """Words of `units`, started at a place of the text's own, as many as make its count
        (each round corrects the word count by the difference)."""
        wanted = self.count(text)
        start = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
        words, tried, best, units = max(1, wanted), set(), "", self.units
        for _ in range(_ROUNDS):
            if words in tried:
                break
            tried.add(words)
            candidate = " ".join(units[(start + i) % len(units)] for i in range(words))
            got = self.count(candidate)
            if got == wanted:
                return candidate
            if got < wanted and len(candidate) > len(best):
                best = candidate
            step = wanted - got
            words = max(1, words + (step if abs(step) > 1 else (1 if step > 0 else -1)))
        self.inexact += 1
        return best or units[start % len(units)]

    def value(self, value: Any) -> Any:
        """Every string inside a JSON value redacted; keys, numbers and booleans kept."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def arguments(self, text: str) -> str:
        """A call's JSON arguments with their string values redacted (text, if not JSON)."""
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return self.text(text)
        return json.dumps(self.value(parsed), ensure_ascii=False)


def redact(transcript: Transcript, count: TokenCount) -> tuple[list[dict[str, Any]], Redactor]:
    """The transcript's records, redacted, in its agent's format; and the redactor (its
    `inexact` says how many texts could not be matched to the token)."""
    redactor = Redactor(count)
    if transcript.agent == "claude":
        records = list(_claude(transcript.lines, redactor))
    else:
        records = list(_codex(transcript.lines, redactor))
    return records, redactor


def write_jsonl(records: Iterable[dict[str, Any]]) -> str:
    """Records as JSONL text, one compact object a line."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)


# --- Claude Code --------------------------------------------------------------------------


def _claude(records: Iterable[dict[str, Any]], redactor: Redactor) -> Iterable[dict[str, Any]]:
    for record in records:
        if not isinstance(record.get("uuid"), str):
            continue  # summaries, file snapshots, queue operations: nothing a replay reads
        kept = {k: record[k] for k in _CLAUDE_KEPT if k in record}
        if "cwd" in record:
            kept["cwd"] = REDACTED_CWD
        message = record.get("message")
        if isinstance(message, dict) and record.get("type") in ("user", "assistant"):
            out = {k: message[k] for k in _MESSAGE_KEPT if k in message}
            out["content"] = _claude_content(message.get("content"), redactor)
            kept["message"] = out
        yield kept


def _claude_content(content: Any, redactor: Redactor) -> Any:
    if isinstance(content, str):
        return redactor.text(content)
    return [_claude_block(b, redactor) for b in content or [] if isinstance(b, dict)]


def _claude_block(block: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": redactor.text(str(block.get("text", "")))}
    if kind == "thinking":
        return {"type": "thinking", "thinking": redactor.text(str(block.get("thinking", ""))),
                "signature": ""}  # fmt: skip
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.get("id"), "name": block.get("name"),
                "input": redactor.value(block.get("input") or {})}  # fmt: skip
    if kind == "tool_result":
        out = {"type": "tool_result", "tool_use_id": block.get("tool_use_id"),
               "content": _claude_content(block.get("content"), redactor)}  # fmt: skip
        if block.get("is_error"):
            out["is_error"] = True
        return out
    # Images, documents, redacted thinking: nothing of them is kept but a marker.
    return {"type": "text", "text": redactor.text(f"[{kind}]")}


# --- Codex --------------------------------------------------------------------------------


def _codex(records: Iterable[dict[str, Any]], redactor: Redactor) -> Iterable[dict[str, Any]]:
    for record in records:
        kind, payload = record.get("type"), record.get("payload")
        if not isinstance(payload, dict):
            continue
        if kind == "session_meta":
            out = {k: payload[k] for k in ("id", "timestamp", "originator", "cli_version",
                                            "source") if k in payload}  # fmt: skip
            out["cwd"] = REDACTED_CWD
            for key in ("instructions", "base_instructions"):
                if payload.get(key):
                    out[key] = redactor.value(payload[key])
        elif kind == "response_item":
            out = _codex_item(payload, redactor)
        elif kind == "compacted":
            history = payload.get("replacement_history")
            out = {"message": redactor.text(str(payload.get("message", "")))}
            if isinstance(history, list):
                out["replacement_history"] = [
                    _codex_item(i, redactor) for i in history if isinstance(i, dict)
                ]
        else:
            continue  # turn_context, event_msg: Codex's own, not sent
        yield {"timestamp": record.get("timestamp"), "type": kind, "payload": out}


def _codex_item(item: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    kind = item.get("type")
    out: dict[str, Any] = {
        k: item[k] for k in ("type", "role", "name", "call_id", "status") if k in item
    }
    if kind == "message":
        out["content"] = [
            {**{k: v for k, v in part.items() if k == "type"},
             "text": redactor.text(str(part.get("text", "")))}
            for part in item.get("content") or [] if isinstance(part, dict)
        ]  # fmt: skip
    elif kind in ("function_call", "custom_tool_call"):
        key = "arguments" if kind == "function_call" else "input"
        out[key] = redactor.arguments(str(item.get(key, "")))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        out["output"] = redactor.value(output) if output is not None else ""
    elif kind == "reasoning":
        out["summary"] = redactor.value(item.get("summary") or [])
        out["content"] = redactor.value(item.get("content")) if item.get("content") else None
        out["encrypted_content"] = None
    else:
        out.update({k: redactor.value(v) for k, v in item.items() if k not in out and k != "id"})
    return out
