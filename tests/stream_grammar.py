"""A strict checker of the streaming grammar in PROTOCOL.md, for tests.

It accepts exactly: message_start (empty content, usage present) → per block
content_block_start (index 0, 1, 2 …, one open at a time) → deltas of the block's kind →
content_block_stop → message_delta (stop_reason set) → message_stop; `ping` anywhere; or a
stream that ends with `error` (and then nothing, in particular no message_stop).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from mlxlaunch.protocol.events import StreamEvent
from mlxlaunch.protocol.sse import SseFrame

_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(StreamEvent)

_DELTAS_FOR_BLOCK = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
    "server_tool_use": {"input_json_delta"},  # as the API streams a web search call's query
}
# Blocks whose input comes as input_json_delta pieces: they start with input {}.
_CALL_BLOCKS = ("tool_use", "server_tool_use")


class StreamGrammarError(AssertionError):
    """The stream broke the grammar; the message says where and how."""


@dataclass
class StreamSummary:
    """What a well-formed stream said."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    pings: int = 0
    event_types: list[str] = field(default_factory=list)


def check_stream(frames: list[SseFrame]) -> StreamSummary:
    """Check `frames` against the grammar; return what they said or raise StreamGrammarError.

    Blocks in the summary are accumulated (text joined, tool input parsed from its pieces).
    """
    summary = StreamSummary()
    state = "before_start"  # → in_message → after_delta → stopped | errored
    open_index: int | None = None
    json_parts: list[str] = []
    for position, sse in enumerate(frames):
        where = f"frame {position} ({sse.event})"
        try:
            data = json.loads(sse.data)
        except (ValueError, RecursionError) as exc:
            raise StreamGrammarError(f"{where}: data is not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("type") != sse.event:
            raise StreamGrammarError(f"{where}: data.type does not match the event name")
        try:
            _EVENT_ADAPTER.validate_python(data)
        except ValidationError as exc:
            raise StreamGrammarError(f"{where}: malformed event: {exc}") from exc
        kind = data["type"]
        summary.event_types.append(kind)
        if state in ("stopped", "errored"):
            raise StreamGrammarError(f"{where}: event after the stream ended ({state})")
        if kind == "ping":
            summary.pings += 1
            continue
        if kind == "error":
            summary.error = data["error"]
            state = "errored"
            continue
        if state == "before_start":
            if kind != "message_start":
                raise StreamGrammarError(f"{where}: first event must be message_start")
            message = data["message"]
            if message["content"]:
                raise StreamGrammarError(f"{where}: message_start content must be empty")
            summary.usage = dict(message["usage"])
            state = "in_message"
            continue
        if kind == "message_start":
            raise StreamGrammarError(f"{where}: second message_start")
        if state == "after_delta":
            if kind != "message_stop":
                raise StreamGrammarError(f"{where}: only message_stop may follow message_delta")
            state = "stopped"
            continue
        if kind == "content_block_start":
            if open_index is not None:
                raise StreamGrammarError(f"{where}: block {open_index} is still open")
            if data["index"] != len(summary.blocks):
                raise StreamGrammarError(
                    f"{where}: index {data['index']}, expected {len(summary.blocks)}"
                )
            block = dict(data["content_block"])
            if block["type"] in _CALL_BLOCKS and block.get("input") != {}:
                raise StreamGrammarError(f"{where}: a tool_use block must start with input {{}}")
            if block["type"] == "thinking" and (block.get("thinking") or block.get("signature")):
                raise StreamGrammarError(f"{where}: a thinking block must start empty")
            summary.blocks.append(block)
            open_index = data["index"]
            json_parts = []
        elif kind == "content_block_delta":
            _check_open(where, open_index, data["index"])
            block = summary.blocks[data["index"]]
            delta = data["delta"]
            if delta["type"] not in _DELTAS_FOR_BLOCK.get(block["type"], set()):
                raise StreamGrammarError(f"{where}: {delta['type']} in a {block['type']} block")
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                if block.get("signature"):
                    raise StreamGrammarError(f"{where}: thinking after the signature")
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                if block.get("signature"):
                    raise StreamGrammarError(f"{where}: a second signature_delta")
                block["signature"] = delta["signature"]
            else:
                json_parts.append(delta["partial_json"])
        elif kind == "content_block_stop":
            _check_open(where, open_index, data["index"])
            block = summary.blocks[data["index"]]
            if block["type"] == "thinking" and not block.get("signature"):
                raise StreamGrammarError(f"{where}: thinking block stopped without a signature")
            if block["type"] in _CALL_BLOCKS:
                try:
                    block["input"] = json.loads("".join(json_parts)) if json_parts else {}
                except (ValueError, RecursionError) as exc:
                    raise StreamGrammarError(f"{where}: tool input is not JSON: {exc}") from exc
            open_index = None
        elif kind == "message_delta":
            if open_index is not None:
                raise StreamGrammarError(f"{where}: message_delta while block {open_index} open")
            if not data["delta"].get("stop_reason"):
                raise StreamGrammarError(f"{where}: message_delta without stop_reason")
            summary.stop_reason = data["delta"]["stop_reason"]
            summary.usage.update({k: v for k, v in data["usage"].items() if v is not None})
            state = "after_delta"
        elif kind == "message_stop":
            raise StreamGrammarError(f"{where}: message_stop before message_delta")
    if state not in ("stopped", "errored"):
        raise StreamGrammarError(f"stream ended early (state {state}): a dropped connection")
    return summary


def _check_open(where: str, open_index: int | None, index: int) -> None:
    if open_index is None or index != open_index:
        raise StreamGrammarError(f"{where}: index {index} is not the open block ({open_index})")
