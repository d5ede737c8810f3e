"""The Codex-session workload: Codex CLI's own requests, over `POST /v1/responses`, streamed.

Turn 1 is the first request Codex CLI 0.171.0 sent (`responses-request-0.json`: two
`developer` messages of instructions, the user's prompt, nine tools), turn 2 the second
(`responses-request-1.json`: the same items resent plus the model's `exec_command` call and its
output) and every later turn grows the same way: one more `function_call` and
`function_call_output`. That is the whole of Codex's caching story — `store: false`, no
`previous_response_id`, the history resent each turn — so what counts is how much of the
previous turn's prompt a server reads back from its prefix cache (the reuse ratio), and the time
to first token that follows from it.

The assistant's side is scripted, as in the other sessions: every server gets the same requests,
never its own model's output. The bodies are sent as captured (unknown tool types and fields
included: a server must ignore them), plus `max_output_tokens` and a temperature, so each turn
stays short and samples like the Claude Code session. It runs on the servers and model of the
Claude Code session, in the same run. A server without a Responses API (mlx_lm.server has
none) answers the first turn with an HTTP error; it is recorded as such and sent nothing more.

Copies of the two captures ship in `data/` (the bench runs from an installed wheel, without the
tests); a test keeps them equal to `tests/fixtures/codex-0.171.0/`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from mlxlaunch.bench.clients import HttpTarget, StreamTiming, content_arrived
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.wire import TEMPERATURE
from mlxlaunch.bench.workloads import tool_result_text

CAPTURES = ("codex_0.171.0_request_0.json", "codex_0.171.0_request_1.json")
CODEX_VERSION = "0.171.0"
# The working directory of the captured session (its `<environment_context>` says so).
CODEX_CWD = "/home/user/project"
# Statuses that mean "no such endpoint" rather than "this request failed".
NO_ENDPOINT = (404, 405, 501)
NO_API = "no Responses API"

# Events whose delta is content the user waits for (what the Messages client counts as a
# content_block_delta): text, a reasoning summary or reasoning text, a call's arguments.
CONTENT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


@cache
def codex_capture(index: int) -> dict[str, Any]:
    """Request `index` (0 or 1) of the captured Codex session, as sent (do not mutate)."""
    name = CAPTURES[index]
    text = resources.files("mlxlaunch.bench.data").joinpath(name).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def codex_call(turn: int) -> dict[str, Any]:
    """The model's `exec_command` call that ends turn `turn` (turn 1's is the captured one),
    in the shape Codex resends it: alternately a file read and a grep, as an agent explores."""
    if turn == 1:
        return copy.deepcopy(codex_capture(1)["input"][-2])
    if turn % 2:
        command = f"sed -n '1,200p' {CODEX_CWD}/src/module_{turn}.py"
    else:
        command = f"rg -n 'cache' {CODEX_CWD}/src | head -80"
    return {
        "type": "function_call",
        "status": "completed",
        "id": f"fc_bench{turn:04d}",
        "name": "exec_command",
        "arguments": json.dumps({"cmd": command}),
        "call_id": f"call_bench{turn:04d}",
    }


def codex_output(turn: int, call: dict[str, Any], chars: int) -> dict[str, Any]:
    """The `function_call_output` Codex sends back for `call` (turn 1's is the captured one):
    Codex's exec header, then `chars` characters of code-like output."""
    if turn == 1:
        return copy.deepcopy(codex_capture(1)["input"][-1])
    body = tool_result_text(turn, chars)
    header = (
        f"Chunk ID: b{turn:05d}\nWall time: 0.0100 seconds\nProcess exited with code 0\n"
        f"Original token count: {max(1, chars // 4)}\nOutput:\n"
    )
    return {
        "type": "function_call_output",
        "id": f"fco_bench{turn:04d}",
        "call_id": call["call_id"],
        "output": header + body,
    }


def codex_session(
    *, turns: int, tool_result_chars: int, max_output_tokens: int
) -> list[dict[str, Any]]:
    """The request bodies of a Codex session of `turns` turns, one per turn.

    Turn 1 is request 0 as captured, turn 2 request 1 as captured; each later turn resends
    everything before it plus one `exec_command` call and its output of `tool_result_chars`
    characters. Every body also carries `max_output_tokens` and the bench's temperature.
    """
    if turns < 1:
        raise ValueError("a Codex session has at least one turn")
    body = copy.deepcopy(codex_capture(0))
    body["max_output_tokens"] = max_output_tokens
    body["temperature"] = TEMPERATURE
    bodies = [body]
    for turn in range(1, turns):
        call = codex_call(turn)
        body = {
            **body,
            "input": [*body["input"], call, codex_output(turn, call, tool_result_chars)],
        }
        bodies.append(body)
    return bodies


def codex_headers(body: dict[str, Any]) -> dict[str, str]:
    """The headers Codex CLI sends with `body` (session and thread ids from its metadata)."""
    metadata = body.get("client_metadata") or {}
    return {
        "accept": "text/event-stream",
        "originator": "codex_exec",
        "session-id": str(metadata.get("session_id", "")),
        "thread-id": str(metadata.get("thread_id", "")),
        "x-codex-turn-metadata": str(metadata.get("x-codex-turn-metadata", "")),
    }


def on_responses_event(event: str, data: str, timing: StreamTiming, now: float) -> None:
    """Fold one Responses SSE event into `timing` (usage from the response it carries; the
    final event's wins)."""
    if data == "[DONE]":
        return
    payload = json.loads(data)
    kind = payload.get("type", event)
    if kind in CONTENT_DELTAS and payload.get("delta"):
        content_arrived(timing, now)
    item = payload.get("item")
    done = kind == "response.output_item.done" and isinstance(item, dict)
    if done and item.get("type") == "function_call":
        timing.calls.append([str(item.get("name", "")), str(item.get("arguments", ""))])
    response = payload.get("response")
    if isinstance(response, dict):
        timing.response_id = timing.response_id or response.get("id")
        usage = response.get("usage")
        if usage:
            timing.prompt_tokens = usage.get("input_tokens")
            timing.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")
            if kind in FINAL_EVENTS:
                timing.output_tokens = usage.get("output_tokens")
        if kind == "response.failed":
            timing.error = json.dumps(response.get("error"))
    if kind == "error":
        timing.error = json.dumps(payload.get("error", payload))


class ResponsesTarget(HttpTarget):
    """A server over `POST /v1/responses` with `stream: true`, as Codex CLI calls it (its
    provider's key, `env_key`, goes as the bearer token)."""

    async def send(self, body: dict[str, Any]) -> StreamTiming:
        """Send one Codex request and time it."""
        headers = {**codex_headers(body), **self._bearer}
        return await self._stream("/v1/responses", body, headers, on_responses_event)


def no_endpoint(timing: StreamTiming) -> str | None:
    """Why a server has no Responses API, when its answer says so (None otherwise)."""
    error = timing.error or ""
    for status in NO_ENDPOINT:
        if error.startswith(f"HTTP {status}"):
            return f"{NO_API}: POST /v1/responses answered HTTP {status}"
    return None


def reuse_ratio(cached: int | None, previous_prompt: int | None) -> float | None:
    """The share of the previous turn's prompt read from the cache this turn (None when the
    server does not report cached tokens or there is no previous turn)."""
    if cached is None or not previous_prompt:
        return None
    return cached / previous_prompt


async def measure_codex_session(
    targets: Sequence[ResponsesTarget],
    bodies: Sequence[dict[str, Any]],
    *,
    progress: ProgressSink,
) -> dict[str, Any]:
    """Every turn on every target that has a Responses API, alternating; raw figures by turn,
    then by target name, each with its reuse of the previous turn's prompt.

    A target whose first turn says it has no such endpoint is recorded under `unsupported`
    and left out of the later turns (it would only answer the same)."""
    unsupported: dict[str, str] = {}
    previous: dict[str, int | None] = {}
    measured = []
    for number, body in enumerate(bodies, start=1):
        live = [t for t in targets if t.name not in unsupported]
        order = live if number % 2 else list(reversed(live))
        results: dict[str, dict[str, Any]] = {}
        for target in order:
            timing = await target.send(body)
            progress.advance()
            if number == 1 and (reason := no_endpoint(timing)):
                unsupported[target.name] = reason
                continue
            figures = timing.as_dict()
            figures["reuse"] = reuse_ratio(timing.cached_tokens, previous.get(target.name))
            previous[target.name] = timing.prompt_tokens
            results[target.name] = figures
        measured.append(
            {
                "turn": number,
                "results": {t.name: results[t.name] for t in live if t.name in results},
            }
        )
    return {
        "targets": [t.name for t in targets],
        "client": f"codex-cli {CODEX_VERSION}",
        "unsupported": unsupported,
        "turns": measured,
    }


def codex_session_steps(bodies: Sequence[dict[str, Any]], targets: int) -> int:
    """Progress steps of the workload (a target without the API only takes the first)."""
    return len(bodies) * targets
