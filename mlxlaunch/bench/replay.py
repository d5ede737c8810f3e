"""The replay workload: one of your own Claude Code or Codex sessions, request by request.

`mlx bench --replay PATH` reads the agent's transcript (`launch/transcripts`) and sends each
request the agent sent, as it sent it — never the served model's new answers, so every server
gets the same prompts — with only the output capped (`turn_max_tokens`) and streaming on. Our
server gets the agent's own body over the agent's own API (`/v1/messages` for Claude Code,
`/v1/responses` for Codex); mlx_lm.server, which has neither, the same request mapped by our
server's own mapping into chat completions (a mid-conversation system turn folded into the
user turn before it, as the Claude Code workload does).

Per turn: time to first token, prompt tokens, tokens reused from the prefix cache, and where
a turn missed the cache, why (our server's own account of the miss, from `/v1/stats`); the
tool calls the answer made, each judged against the request's tools; decode speed.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mlxlaunch.bench.clients import AnthropicTarget, OpenAITarget, StreamTiming
from mlxlaunch.bench.codex_session import ResponsesTarget
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.runner import alternate, timed_figures
from mlxlaunch.bench.workloads import Conversation
from mlxlaunch.engine.types import ChatMessage, GenerationRequest
from mlxlaunch.launch.transcripts import Transcript, read_transcript
from mlxlaunch.launch.transcripts.records import Api
from mlxlaunch.launch.transcripts.redact import TokenCount, redact, write_jsonl
from mlxlaunch.protocol.openai_responses import ResponsesRequest
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.stats import StatsSnapshot
from mlxlaunch.server import mapping, responses_mapping
from mlxlaunch.server.images import TEXT_ONLY

JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


@dataclass(frozen=True)
class ReplayTurn:
    """One recorded request, ready to send.

    Args:
        number: its place in the session, from 1.
        api: the agent's API.
        body: the agent's body, streamed, output capped.
        conversation: the same request for a chat-completions server.
        tools: the offered tools' input schemas by name (to judge the answer's calls).
        recorded_calls: the tools the recorded answer called.
    """

    number: int
    api: Api
    body: dict[str, Any]
    conversation: Conversation
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    recorded_calls: tuple[str, ...] = ()


def generation_request(body: dict[str, Any], api: Api) -> GenerationRequest:
    """The engine request our server makes of `body` (its own mapping, so both servers are
    sent the same conversation)."""
    if api == "messages":
        return mapping.to_generation_request(MessagesRequest.model_validate(body))
    request = ResponsesRequest.model_validate(body)
    generation, _ = responses_mapping.to_generation_request(
        request, request.items, request_id="", images=TEXT_ONLY, thinks=True, context_window=None
    )
    return generation


def chat_conversation(generation: GenerationRequest) -> Conversation:
    """`generation` as a bench conversation: the leading system message is the system text; a
    later one is folded into the user turn before it (not every template takes it)."""
    messages = list(generation.messages)
    system = messages.pop(0).content if messages and messages[0].role == "system" else ""
    folded: list[ChatMessage] = []
    for message in messages:
        if message.role == "system" and folded and folded[-1].role == "user":
            reminder = f"\n\n<system-reminder>\n{message.content}\n</system-reminder>"
            folded[-1] = ChatMessage(role="user", content=folded[-1].content + reminder)
        elif message.role == "system":
            folded.append(ChatMessage(role="user", content=message.content))
        else:
            folded.append(message)
    return Conversation(system, tuple(generation.tools), folded, thinking=generation.thinking)


def replay_turns(transcript: Transcript, *, max_tokens: int) -> list[ReplayTurn]:
    """Every recorded request of `transcript`, streamed, its output capped at `max_tokens`."""
    turns = []
    for number, recorded in enumerate(transcript.turns, start=1):
        body = copy.deepcopy(recorded.body)
        body["stream"] = True
        body["max_tokens" if recorded.api == "messages" else "max_output_tokens"] = max_tokens
        generation = generation_request(body, recorded.api)
        turns.append(
            ReplayTurn(
                number=number,
                api=recorded.api,
                body=body,
                conversation=chat_conversation(generation),
                tools={t.name: t.parameters for t in generation.tools},
                recorded_calls=recorded.answered_tools,
            )
        )
    return turns


def call_problem(name: str, arguments: str, tools: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with a call the model made, or None: the tool must be one offered, its
    arguments a JSON object with the schema's required keys, no key the schema forbids, and
    each key of the type the schema gives."""
    if name not in tools:
        return f"no tool named {name!r} was offered"
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "arguments are not JSON"
    if not isinstance(value, dict):
        return "arguments are not a JSON object"
    schema = tools[name]
    properties = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or [] if k not in value]
    if missing:
        return f"missing required {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = [k for k in value if k not in properties]
        if extra:
            return f"unknown argument {', '.join(extra)}"
    for key, item in value.items():
        kind = (properties.get(key) or {}).get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        known = [JSON_TYPES[k] for k in kinds if isinstance(k, str) and k in JSON_TYPES]
        if known and not any(isinstance(item, t) for t in known):
            return f"{key} is not {' or '.join(str(k) for k in kinds)}"
    return None


def miss_of(snapshot: StatsSnapshot, response_id: str | None) -> dict[str, Any] | None:
    """The server's account of why the request `response_id` missed its prefix cache, if
    the latest miss is that request's (the main model's or another's)."""
    for stats in (snapshot, *snapshot.models):
        miss = stats.cache.last_miss
        if miss is not None and response_id and miss.request_id == response_id:
            return {
                "kind": miss.kind,
                "position": miss.position,
                "request_tokens": miss.request_tokens,
                "nearest_tokens": miss.nearest_tokens,
                "cached_tokens": miss.cached_tokens,
                "digests": miss.digests.model_dump(),
            }
    return None


class ReplayTarget(Protocol):
    """A server the replay sends its turns to."""

    name: str

    async def replay(self, turn: ReplayTurn, max_tokens: int) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


def figures(timing: StreamTiming, turn: ReplayTurn) -> dict[str, Any]:
    """A turn's raw figures, with its calls judged against the offered tools."""
    data = timed_figures(timing)
    data["calls"] = [
        {"name": name, "problem": call_problem(name, arguments, turn.tools)}
        for name, arguments in timing.calls
    ]
    data["recorded_calls"] = list(turn.recorded_calls)
    data["miss"] = None
    return data


class ServedReplay:
    """Our server: the agent's own body over the agent's own API, then `/v1/stats` for why
    a turn missed the cache."""

    def __init__(self, name: str, base_url: str, *, auth_token: str | None = None) -> None:
        self.name = name
        self._messages = AnthropicTarget(name, base_url, auth_token=auth_token)
        self._responses = ResponsesTarget(name, base_url, auth_token=auth_token)

    async def replay(self, turn: ReplayTurn, max_tokens: int) -> dict[str, Any]:
        """Send `turn` as recorded (`max_tokens` is already in its body)."""
        client = self._messages if turn.api == "messages" else self._responses
        timing = await client.send(turn.body)
        data = figures(timing, turn)
        stats = await self._messages.get_json("/v1/stats")
        if stats is not None:
            data["miss"] = miss_of(StatsSnapshot.model_validate(stats), timing.response_id)
        return data

    async def aclose(self) -> None:
        await self._messages.aclose()
        await self._responses.aclose()


class ChatReplay:
    """A chat-completions server (mlx_lm.server): the same request, mapped."""

    def __init__(self, target: OpenAITarget) -> None:
        self.name = target.name
        self._target = target

    async def replay(self, turn: ReplayTurn, max_tokens: int) -> dict[str, Any]:
        """Send `turn`'s conversation with `max_tokens`."""
        return figures(await self._target.measure(turn.conversation, max_tokens), turn)

    async def aclose(self) -> None:
        await self._target.aclose()


def describe(transcript: Transcript) -> dict[str, Any]:
    """What was replayed, for the report: no text of the session, no full path."""
    return {
        "agent": transcript.agent,
        "version": transcript.version,
        "session_id": transcript.session_id,
        "file": transcript.path.name,
        "turns": len(transcript.turns),
        "filled_from_capture": list(transcript.filled),
        "capture": transcript.template,
    }


async def measure_replay(
    targets: Sequence[ReplayTarget],
    turns: Sequence[ReplayTurn],
    *,
    max_tokens: int,
    progress: ProgressSink,
) -> dict[str, Any]:
    """Every turn on every target, alternating; raw figures by turn, then by target name."""

    async def send(turn: ReplayTurn) -> dict[str, dict[str, Any]]:
        async def run(target: ReplayTarget) -> dict[str, Any]:
            result = await target.replay(turn, max_tokens)
            progress.advance()
            return result

        return await alternate(targets, turn.number, run)

    measured = [{"turn": t.number, "results": await send(t)} for t in turns]
    return {"targets": [t.name for t in targets], "turns": measured}


def model_token_count(model_dir: str) -> TokenCount:
    """Counts tokens as `model_dir`'s tokenizer does (no special tokens)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(Path(model_dir))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def write_redacted(transcript: Transcript, count: TokenCount, out: Path) -> tuple[Transcript, int]:
    """Write `transcript` redacted (same token counts under `count`) to `out`, in its agent's
    format, and read it back: the replay then sends what can be shared. Returns it and how
    many texts could not be matched to the token."""
    records, redactor = redact(transcript, count)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(write_jsonl(records), encoding="utf-8")
    return read_transcript(out), redactor.inexact


@dataclass(frozen=True)
class ReplaySetting:
    """A server setting the replay is run again under: its flag and its engine option."""

    label: str  # as the flag is written, e.g. "--kv-bits 8"
    options: dict[str, Any]


def replay_settings(kv_bits: Sequence[int], speculate: Sequence[str]) -> list[ReplaySetting]:
    """One setting per `--kv-bits` value and per `--speculate` mode, each alone (the others
    at their defaults, as the run's own server has them)."""
    return [ReplaySetting(f"--kv-bits {b}", {"kv_bits": b}) for b in kv_bits] + [
        ReplaySetting(f"--speculate {m}", {"speculate": m}) for m in speculate
    ]


async def measure_settings(
    model_dir: str,
    turns: Sequence[ReplayTurn],
    settings: Sequence[ReplaySetting],
    *,
    max_tokens: int,
    progress: ProgressSink,
    engine_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The replay on a server of ours per setting, each started alone on a fresh cache
    directory and stopped after; raw figures per setting."""
    from mlxlaunch.bench.ours import OURS_NAME, start_local_server

    measured = []
    for setting in settings:
        progress.begin(f"replay with {setting.label}", len(turns))
        with tempfile.TemporaryDirectory(prefix="mlx-bench-replay-") as cache_dir:
            local = await start_local_server(
                model_dir, cache_dir=Path(cache_dir), **{**(engine_options or {}),
                                                        **setting.options}
            )  # fmt: skip
            target = ServedReplay(OURS_NAME, local.url, auth_token=local.auth_token)
            try:
                figures = await measure_replay(
                    [target], turns, max_tokens=max_tokens, progress=progress
                )
            finally:
                await target.aclose()
                local.stop()
        measured.append({"setting": setting.label, **figures})
    return measured
