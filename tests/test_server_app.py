"""The server on a real socket with the real engine and the tiny test model; the official
`anthropic` SDK (and raw httpx for captured Claude Code requests) as the client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from stream_grammar import StreamSummary, check_stream

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.failing import ForwardFailures, fail_forward
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOKEN = "test-token-123"
AUTH = {"authorization": f"Bearer {TOKEN}"}
HI = [{"role": "user", "content": "hi"}]
BASH_TOOL = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
SCRIPTED_TOOL_REPLY = (
    "<think>\nlist the files\n</think>\n\nLooking."
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
)


@dataclass
class Served:
    engine: Engine
    server: ServerHandle
    scripted: ScriptedOutput
    failures: ForwardFailures

    @property
    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.server.url, api_key=TOKEN, max_retries=0)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            self.server.url + path,
            content=content,
            headers={"content-type": "application/json", **AUTH, **(headers or {})},
            timeout=60,
        )


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    scripted = ScriptedOutput()
    failures = ForwardFailures()
    engine = Engine(
        EngineConfig(
            model=str(tiny_model_dir), logits_hook=scripted, model_wrapper=fail_forward(failures)
        )
    )
    engine.start()
    server = start_server(engine, ServerSettings(auth_token=TOKEN))
    try:
        yield Served(engine, server, scripted, failures)
    finally:
        server.stop()
        engine.close()


def _stream_summary(response: httpx.Response) -> StreamSummary:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return check_stream(parse_frames(response.text))


def _envelope(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    return str(body["error"]["message"])


# --- the SDK as client --------------------------------------------------------------------


def test_create(served: Served) -> None:
    message = served.client.messages.create(model="local-opus-x", max_tokens=6, messages=HI)
    assert message.model == "local-opus-x"
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 6
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    assert all(block.type == "text" for block in message.content)


def test_stream_builds_the_final_message(served: Served) -> None:
    with served.client.messages.stream(
        model="claude-sonnet-4-5[1m]", max_tokens=6, messages=HI
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.model == "claude-sonnet-4-5[1m]"
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "".join(texts) == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens >= 1


def test_count_tokens_matches_the_prompt(served: Served) -> None:
    body: dict[str, Any] = {
        "model": "any",
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "count me please"}],
        "tools": [BASH_TOOL],
    }
    counted = served.client.messages.count_tokens(**body)
    message = served.client.messages.create(max_tokens=2, **body)
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == prompt > 0
    # A different prompt counts differently: the number is measured, not made up.
    longer = served.client.messages.count_tokens(**{**body, "system": "You are terse. " * 20})
    assert longer.input_tokens > counted.input_tokens


def test_scripted_tool_call_same_content_both_ways(served: Served) -> None:
    kwargs: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": HI,
        "tools": [BASH_TOOL],
        "thinking": {"type": "enabled", "budget_tokens": 50},
    }
    served.scripted.enqueue(SCRIPTED_TOOL_REPLY)
    message = served.client.messages.create(**kwargs)
    served.scripted.enqueue(SCRIPTED_TOOL_REPLY)
    raw = served.post("/v1/messages", {**kwargs, "stream": True})
    summary = _stream_summary(raw)
    assert message.stop_reason == summary.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    block = message.content[2]
    assert (
        block.type == "tool_use" and block.name == "Bash" and block.input == {"command": "ls -la"}
    )
    as_dicts = [b.to_dict() for b in message.content]
    for streamed, built in zip(summary.blocks, as_dicts, strict=True):
        if streamed["type"] == "tool_use":  # ids are fresh per response
            streamed, built = {**streamed, "id": ""}, {**built, "id": ""}
        assert streamed == {k: v for k, v in built.items() if v is not None}


# --- captured Claude Code requests --------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["print-mode-request.json", "title-request.json", "tool-result-request.json"]
)
def test_claude_code_requests(served: Served, fixtures_dir: Path, name: str) -> None:
    captured = json.loads((fixtures_dir / name).read_text())
    body = captured["body"]
    body["max_tokens"] = 8
    headers = {
        k: v
        for k, v in (captured.get("headers") or {}).items()
        if k.lower()
        not in ("content-length", "host", "authorization", "accept-encoding", "connection")
    }
    response = served.post(captured["path"], body, headers)
    summary = _stream_summary(response)
    assert summary.stop_reason in ("end_turn", "max_tokens")
    assert summary.usage["output_tokens"] <= 8
    assert (
        summary.usage["input_tokens"] + summary.usage["cache_read_input_tokens"] > 1000
        or name == "title-request.json"
    )


def test_head_api_hello(served: Served, fixtures_dir: Path) -> None:
    probe = json.loads((fixtures_dir / "head-api-hello.json").read_text())
    response = httpx.request(probe["method"], served.server.url + probe["path"])
    assert response.status_code == 200
    assert httpx.get(served.server.url + "/api/hello").status_code == 200


# --- bad input ----------------------------------------------------------------------------


def _valid(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 3, "messages": HI, **fields}


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"", "not valid JSON"),
        ({"model": "m", "messages": HI}, "max_tokens: Field required"),
        (_valid(max_tokens=0), "max_tokens:"),
        (_valid(max_tokens=-1), "max_tokens:"),
        (_valid(max_tokens=1.5), "max_tokens:"),
        (_valid(max_tokens="10"), "max_tokens:"),
        (_valid(messages=[]), "messages:"),
        (_valid(model=5), "model:"),
        (_valid(messages=[{"role": "robot", "content": "x"}]), "messages.0.role:"),
        (
            _valid(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "tool_result"}],
                    }
                ]
            ),
            "messages.0.content.1.tool_use_id: Field required",
        ),
        (_valid(messages=[{"role": "user", "content": [{"type": "nope"}]}]), "'nope'"),
        (_valid(stop_sequences=["END", " "]), "stop_sequences.1: each stop sequence must"),
        (_valid(messages=[{"role": "user", "content": []}]), "messages.0.content: all messages"),
        (
            _valid(
                messages=[
                    *HI,
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": ""},
                ]
            ),
            "messages.2.content: all messages must have non-empty content",
        ),
        (
            _valid(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            "messages.0.content.0.text: text content blocks must be non-empty",
        ),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(served: Served, body: Any, names: str) -> None:
    for stream in (False, True):
        sent = {**body, "stream": stream} if isinstance(body, dict) else body
        message = _envelope(served.post("/v1/messages", sent), 400, "invalid_request_error")
        assert names in message
    ok = served.client.messages.create(model="m", max_tokens=2, messages=HI)
    assert ok.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens_validates_too(served: Served) -> None:
    message = _envelope(
        served.post("/v1/messages/count_tokens", {"model": "m", "messages": []}),
        400,
        "invalid_request_error",
    )
    assert message.startswith("messages:")
    empty_turn = {"model": "m", "messages": [{"role": "user", "content": ""}]}
    message = _envelope(
        served.post("/v1/messages/count_tokens", empty_turn), 400, "invalid_request_error"
    )
    assert message.startswith("messages.0.content: all messages must have non-empty content")


def test_empty_final_assistant_prefill_is_served(served: Served) -> None:
    # Anthropic allows the final assistant turn (a prefill) to be empty; so do we.
    no_blocks: list[Any] = []
    for content in ("", no_blocks):
        body = _valid(messages=[*HI, {"role": "assistant", "content": content}])
        response = served.post("/v1/messages", body)
        assert response.status_code == 200, response.text
        assert response.json()["type"] == "message"


# --- auth, routes, model ids --------------------------------------------------------------


def test_auth(served: Served) -> None:
    url = served.server.url + "/v1/messages"
    body = _valid()
    _envelope(httpx.post(url, json=body), 401, "authentication_error")
    _envelope(
        httpx.post(url, json=body, headers={"authorization": "Bearer wrong"}),
        401,
        "authentication_error",
    )
    _envelope(
        httpx.post(url, json=body, headers={"x-api-key": "wrong"}), 401, "authentication_error"
    )
    _envelope(httpx.get(served.server.url + "/v1/models"), 401, "authentication_error")
    assert httpx.post(url, json=body, headers={"x-api-key": TOKEN}, timeout=60).status_code == 200
    assert httpx.post(url, json=body, headers=AUTH, timeout=60).status_code == 200
    # Claude Code sends an empty x-api-key next to the bearer token.
    both = {**AUTH, "x-api-key": ""}
    assert httpx.post(url, json=body, headers=both, timeout=60).status_code == 200
    assert httpx.get(served.server.url + "/health").status_code == 200  # no auth
    # The stats routes for `mlx dash` sit behind the same auth.
    _envelope(httpx.get(served.server.url + "/v1/stats"), 401, "authentication_error")
    assert httpx.get(served.server.url + "/v1/stats", headers=AUTH).status_code == 200


def test_unknown_routes_and_methods(served: Served) -> None:
    url = served.server.url
    _envelope(httpx.get(url + "/v1/nothing", headers=AUTH), 404, "not_found_error")
    _envelope(httpx.get(url + "/v1/messages", headers=AUTH), 405, "invalid_request_error")


def test_models(served: Served) -> None:
    listing = served.client.models.list()
    assert len(listing.data) == 1
    info = served.engine.model_info
    assert info is not None and listing.data[0].id == Path(info.id).name  # no local path
    # The listed id is one the server accepts back as `model`.
    again = served.client.messages.create(model=listing.data[0].id, max_tokens=2, messages=HI)
    assert again.model == listing.data[0].id
    health = httpx.get(served.server.url + "/health").json()  # no auth: reveals no path
    assert health["model"] == listing.data[0].id and "/" not in health["model"]
    one = served.client.models.retrieve("claude-haiku-4-5-20251001")
    assert one.id == "claude-haiku-4-5-20251001"


# --- failures -----------------------------------------------------------------------------


def test_failing_forward_non_streaming_is_500_and_server_survives(served: Served) -> None:
    served.failures.fail_next(times=1)
    try:
        response = served.post("/v1/messages", _valid(max_tokens=5))
    finally:
        served.failures.heal()
    message = _envelope(response, 500, "api_error")
    assert "injected forward failure" in message
    ok = served.client.messages.create(model="m", max_tokens=2, messages=HI)
    assert ok.usage.output_tokens >= 1


def test_failing_forward_mid_stream_is_an_error_event(served: Served) -> None:
    served.scripted.enqueue("one two three four five six seven eight nine ten")
    served.failures.fail_next(times=1, after=3)  # prefill and two decode steps succeed
    try:
        response = served.post("/v1/messages", _valid(max_tokens=30, stream=True))
    finally:
        served.failures.heal()
    summary = _stream_summary(response)
    assert summary.error is not None and summary.error["type"] == "api_error"
    assert "message_start" in summary.event_types and "message_stop" not in summary.event_types
    with served.client.messages.stream(model="m", max_tokens=2, messages=HI) as stream:
        assert stream.get_final_message().usage.output_tokens >= 1


def test_client_disconnect_cancels_the_request(served: Served) -> None:
    before = served.engine.stats().counters.requests_cancelled
    served.scripted.enqueue(" word" * 3000)
    body = _valid(max_tokens=3000, stream=True)
    with httpx.stream(
        "POST", served.server.url + "/v1/messages", json=body, headers=AUTH, timeout=60
    ) as response:
        for line in response.iter_lines():
            if "content_block_delta" in line:
                break  # leave mid-stream
    deadline = time.monotonic() + 10
    while served.engine.stats().counters.requests_cancelled == before:
        assert time.monotonic() < deadline, "the engine never saw the cancellation"
        time.sleep(0.05)
    ok = served.client.messages.create(model="m", max_tokens=2, messages=HI)
    assert ok.usage.output_tokens >= 1


def test_refusals_keep_their_status(tiny_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir), context_length=64, max_queue=0))
    engine.start()
    server = start_server(engine, ServerSettings())
    try:
        url = server.url + "/v1/messages"
        long_prompt = [{"role": "user", "content": "many words " * 100}]
        for stream in (False, True):
            too_long = httpx.post(url, json=_valid(messages=long_prompt, stream=stream), timeout=60)
            message = _envelope(too_long, 400, "invalid_request_error")
            assert message.startswith("prompt is too long:") and "> 64 maximum" in message
            busy = httpx.post(url, json=_valid(stream=stream), timeout=60)
            _envelope(busy, 429, "rate_limit_error")
            assert busy.headers["x-should-retry"] == "true"
            assert int(busy.headers["retry-after"]) >= 1
    finally:
        server.stop()
        engine.close()


def test_stop_frees_the_port(tiny_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    server = start_server(engine, ServerSettings())
    port = server.port
    assert port > 0 and server.url == f"http://127.0.0.1:{port}"
    assert httpx.get(server.url + "/health").status_code == 200
    server.stop(timeout=5)
    assert not server.running
    again = start_server(engine, ServerSettings(port=port))
    try:
        assert again.port == port
    finally:
        again.stop()
        engine.close()
