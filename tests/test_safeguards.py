"""Claude Code's auto-mode safety check answered locally (server/safeguards.py).

A request carrying `safeguards` (as Claude Code 2.1.332 sends it in auto mode) gets the
loaded model's verdict for each tool call of the turn, in `message_delta.delta.
safeguard_results` (streaming) or at the top of the message; the check turned off, or a
model too small to judge, answers the explicit `unavailable`/`disabled` form; a check that
fails or times out never fails the turn.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    Done,
    EngineEvent,
    GenerationFailed,
    GenerationRequest,
    ModelInfo,
    TextDelta,
    Usage,
)
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.responses import Message, ResponseToolUseBlock
from mlxlaunch.protocol.safeguards import SafeguardResult
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.server.safeguards import (
    SafetyCheck,
    SafetyCheckSettings,
    estimate_parameters,
    verdict_schema,
)
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # the server tests serve a model

BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,dangerous-tool-use-2026-09-03"
COMMAND = "python3 -c 'print(6*7)' > out.txt"
CALL = json.dumps({"name": "Bash", "arguments": {"command": COMMAND, "description": "Run"}})
TOOL_TURN = f"</think>\n\n<tool_call>\n{CALL}\n</tool_call>"

# As Claude Code 2.1.332 sends it in auto mode (`claude -p … --permission-mode auto`),
# recorded from the real CLI with the paths replaced.
SAFEGUARDS = [
    {
        "type": "dangerous_tool_use",
        "classifier_context": {
            "v": 1,
            "permission_mode": "auto",
            "platform": "linux",
            "live_cwd": "/work/project",
            "home_dir": "/home/user",
            "trusted_directories": {
                "primary": {"path": "/work/project", "resolved": ["/work/project"]},
                "additional": [],
                "network": [],
                "block_reads_outside_working_directories": False,
            },
            "rules": {"allow": [], "deny": [], "ask": []},
            "auto_mode": {"allow": [], "soft_deny": [], "hard_deny": [], "environment": []},
            "classify_all_shell": False,
            "git_state": {"cwd": "/work/project", "root": None, "error": "not_a_repo"},
            "classifier_facts": {"bashPrescreenRetry": "true"},
            "refused_calls": [],
        },
    }
]
RESULTS = TypeAdapter(list[SafeguardResult])


def verdict(outcome: str, explanation: str = "It runs a small local script.") -> str:
    """The classifier's answer for one call, exactly as the grammar lets the model write it."""
    return json.dumps({"1": {"explanation": explanation, "outcome": outcome}})


@dataclass
class Served:
    engine: Engine
    scripted: ScriptedOutput
    on: ServerHandle  # the check on, any model size
    off: ServerHandle  # --no-safeguards
    sized: ServerHandle  # the check on, with the default minimum model size


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    scripted = ScriptedOutput()
    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=scripted))
    engine.start()
    servers = [
        start_server(engine, ServerSettings(safeguards_min_parameters=0)),
        start_server(engine, ServerSettings(safeguards=False)),
        start_server(engine, ServerSettings()),
    ]
    try:
        yield Served(engine, scripted, *servers)
    finally:
        for server in servers:
            server.stop()
        engine.close()


def auto_mode_body(fixtures_dir: Path, *, stream: bool, safeguards: bool = True) -> dict[str, Any]:
    """The captured `-p` request, as auto mode sends it: with `safeguards`."""
    captured = json.loads((fixtures_dir / "print-mode-request.json").read_text())
    body = copy.deepcopy(captured["body"])
    body["stream"] = stream
    body["max_tokens"] = 64
    if safeguards:
        body["safeguards"] = copy.deepcopy(SAFEGUARDS)
    return body


def post(server: ServerHandle, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/messages",
        json=body,
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": BETAS},
        timeout=120,
    )


def stream_events(server: ServerHandle, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = post(server, body)
    assert response.status_code == 200, response.text
    return [frame.json() for frame in parse_frames(response.text) if frame.event != "ping"]


def tool_use_ids(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["content_block"]["id"]
        for e in events
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    ]


def message_delta(events: list[dict[str, Any]]) -> dict[str, Any]:
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    return delta["delta"]


# --- the server --------------------------------------------------------------------------------


def test_a_streamed_tool_call_gets_the_models_verdict_on_message_delta(
    served: Served, fixtures_dir: Path
) -> None:
    served.scripted.enqueue(text=TOOL_TURN)
    served.scripted.enqueue(text=verdict("not_flagged"))
    events = stream_events(served.on, auto_mode_body(fixtures_dir, stream=True))
    (call_id,) = tool_use_ids(events)
    delta = message_delta(events)
    assert delta["stop_reason"] == "tool_use"
    RESULTS.validate_python(delta["safeguard_results"])  # the shape Claude Code parses
    assert delta["safeguard_results"] == [
        {
            "type": "dangerous_tool_use",
            "status": {
                "type": "available",
                "tool_uses": {
                    call_id: {
                        "type": "evaluated",
                        "outcome": "not_flagged",
                        "explanation": "It runs a small local script",
                    }
                },
            },
        }
    ]
    assert events[-1]["type"] == "message_stop"


def test_a_flagged_call_is_flagged_in_a_non_streaming_answer(
    served: Served, fixtures_dir: Path
) -> None:
    served.scripted.enqueue(text=TOOL_TURN)
    served.scripted.enqueue(text=verdict("flagged", "It runs code the user did not ask for."))
    response = post(served.on, auto_mode_body(fixtures_dir, stream=False))
    assert response.status_code == 200, response.text
    message = response.json()
    (call,) = [b for b in message["content"] if b["type"] == "tool_use"]
    (result,) = RESULTS.validate_python(message["safeguard_results"])
    assert result.status.type == "available"
    judged = result.status.tool_uses[call["id"]]
    assert judged.type == "evaluated" and judged.outcome == "flagged"


def test_the_models_own_answer_is_always_a_well_formed_verdict(
    served: Served, fixtures_dir: Path
) -> None:
    # Nothing scripted for the check: the random-weight model samples, held to the schema.
    served.scripted.enqueue(text=TOOL_TURN)
    events = stream_events(served.on, auto_mode_body(fixtures_dir, stream=True))
    (call_id,) = tool_use_ids(events)
    (result,) = RESULTS.validate_python(message_delta(events)["safeguard_results"])
    assert result.status.type == "available"
    assert result.status.tool_uses[call_id].type in ("evaluated", "unavailable")


def test_a_turn_without_tool_calls_has_nothing_to_judge(served: Served, fixtures_dir: Path) -> None:
    served.scripted.enqueue(text="</think>\n\nHello.")
    events = stream_events(served.on, auto_mode_body(fixtures_dir, stream=True))
    assert message_delta(events)["safeguard_results"] == [
        {"type": "dangerous_tool_use", "status": {"type": "available", "tool_uses": {}}}
    ]


def test_without_safeguards_in_the_request_the_answer_is_unchanged(
    served: Served, fixtures_dir: Path
) -> None:
    served.scripted.enqueue(text=TOOL_TURN)
    events = stream_events(served.on, auto_mode_body(fixtures_dir, stream=True, safeguards=False))
    assert "safeguard_results" not in message_delta(events)
    served.scripted.enqueue(text=TOOL_TURN)
    body = auto_mode_body(fixtures_dir, stream=False, safeguards=False)
    assert "safeguard_results" not in post(served.on, body).json()


@pytest.mark.parametrize("server", ["off", "sized"])
def test_a_check_that_cannot_run_says_so_explicitly(
    served: Served, fixtures_dir: Path, server: str
) -> None:
    # --no-safeguards, and the tiny model under the default minimum size: no model call.
    served.scripted.enqueue(text=TOOL_TURN)
    events = stream_events(getattr(served, server), auto_mode_body(fixtures_dir, stream=True))
    delta = message_delta(events)
    assert delta["stop_reason"] == "tool_use"
    assert delta["safeguard_results"] == [
        {"type": "dangerous_tool_use", "status": {"type": "unavailable", "reason": "disabled"}}
    ]


# --- the check on its own: failures never fail the turn ---------------------------------------


class FakeEngine:
    """A ServingEngine whose check request answers `text`, raises, or never ends."""

    def __init__(self, behaviour: str, text: str = "") -> None:
        self.behaviour = behaviour
        self.text = text
        self.cancelled: list[str] = []
        self.seen: list[GenerationRequest] = []
        self.model_info = ModelInfo(id="m", path="", context_window=4096)

    async def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]:
        self.seen.append(req)
        if self.behaviour == "raise":
            raise GenerationFailed("out of memory")
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        yield TextDelta(self.text)
        yield Done("end_turn", Usage(100, 0, 10))

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def judged(engine: FakeEngine, **settings: Any) -> list[SafeguardResult]:
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "run the script"}],
            "safeguards": SAFEGUARDS,
        }
    )
    call = ResponseToolUseBlock(id="toolu_1", name="Bash", input={"command": COMMAND})
    message = Message(id="msg_1", model="m", content=[call])
    check = SafetyCheck(engine, SafetyCheckSettings(min_parameters=0, **settings))
    pending = check.for_request(body)
    assert pending is not None
    asyncio.run(pending.attach([], message))
    assert message.safeguard_results is not None
    return message.safeguard_results


@pytest.mark.parametrize(
    ("behaviour", "text", "reason"),
    [("raise", "", "error"), ("hang", "", "timeout"), ("text", "not json", "error")],
)
def test_a_failing_check_answers_unavailable_for_each_call(
    behaviour: str, text: str, reason: str
) -> None:
    engine = FakeEngine(behaviour, text)
    (result,) = judged(engine, timeout_s=0.2)
    assert result.model_dump()["status"] == {
        "type": "available",
        "tool_uses": {"toolu_1": {"type": "unavailable", "reason": reason}},
    }
    if behaviour == "hang":
        assert engine.cancelled == ["msg_1-safety"]  # no generation left running for nobody


def test_the_check_request_is_short_greedy_and_held_to_the_verdict_schema() -> None:
    engine = FakeEngine("text", verdict("not_flagged"))
    (result,) = judged(engine)
    assert result.status.type == "available"
    (request,) = engine.seen
    assert request.response_schema == verdict_schema(1)
    assert request.max_tokens <= 128 and not request.tools and not request.thinking
    assert request.sampling.temperature == 0.0 and request.kind == "other"
    prompt = request.messages[-1].content
    assert "run the script" in prompt and COMMAND in prompt and "/work/project" in prompt


def test_model_size_is_estimated_from_its_weights(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4000)
    assert estimate_parameters(tmp_path) == 2000  # 16-bit
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"bits": 4}}))
    assert estimate_parameters(tmp_path) == 8000
    assert estimate_parameters(tmp_path / "missing") is None


@pytest.mark.parametrize("field", [{"x": 1}, "on", [1, "two"], [{"no_type": True}]])
def test_an_unreadable_safeguards_field_is_ignored_not_refused(field: Any) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]}
    request = MessagesRequest.model_validate({**body, "safeguards": field})
    assert not request.safeguards
    assert SafetyCheck(FakeEngine("text"), SafetyCheckSettings()).for_request(request) is None


def test_an_answer_no_reader_holds_is_unreadable_not_an_error() -> None:
    """Model output: a 5,000-digit integer or deep nesting in the verdict was a ValueError
    (RecursionError) out of the check, where unreadable means `unavailable`."""
    from mlxlaunch.server.safeguards import parse_verdicts

    call = ResponseToolUseBlock(id="toolu_1", name="Bash", input={})
    for text in ('{"1": ' + "7" * 5000 + "}", "[" * 100_000 + "]" * 100_000):
        assert parse_verdicts(text, [call]) is None
