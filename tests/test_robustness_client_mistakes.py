"""Robustness II, item 6: a client's mistake is a 400 in Anthropic's envelope, never a 500.

Sibling forms included: every junk shape a tool or response schema can take, under every tool
choice, on families whose grammars and readers read schemas differently; and JSON that parses
but that Python will not hold, on both endpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import served_engine

from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.testing.builder import build_model

pytestmark = pytest.mark.slow  # every test here serves a model

TOKEN = "robust-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
FAMILIES = ["qwen", "qwen3_coder", "gemma4"]
JUNK_SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": 5},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": [{"x": 1}]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"},
    {"type": "object", "properties": [1, 2]},
    {"type": "object", "properties": {"a": 7}},
    {"type": 7},
    {"type": "object", "properties": {"a": {"enum": "xyz"}}},
    {"type": "object", "x-guidance": 5},
    {"type": "object", "x-guidance": [1]},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
]


@pytest.fixture(scope="module", params=FAMILIES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    directory = build_model(
        tmp_path_factory.mktemp(str(request.param)), "tiny", template=request.param
    )
    with served_engine(Path(directory), TOKEN) as (_, handle):
        yield handle


def post(server: ServerHandle, path: str, payload: bytes | dict[str, Any]) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return httpx.post(server.url + path, content=content, headers=HEADERS, timeout=120)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def assert_client_error_or_answer(response: httpx.Response) -> None:
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("schema", JUNK_SCHEMAS, ids=[str(i) for i in range(len(JUNK_SCHEMAS))])
def test_junk_tool_schemas_are_never_a_500(server: ServerHandle, schema: Any) -> None:
    for choice in ({"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "t"}):
        for strict in (False, True):
            tool = {"name": "t", "description": "d", "input_schema": schema, "strict": strict}
            payload = body(tools=[tool], tool_choice=choice)
            assert_client_error_or_answer(post(server, "/v1/messages", payload))
            assert_client_error_or_answer(post(server, "/v1/messages", {**payload, "stream": True}))
            counted = {k: v for k, v in payload.items() if k != "max_tokens"}
            assert_client_error_or_answer(post(server, "/v1/messages/count_tokens", counted))


@pytest.mark.parametrize("schema", JUNK_SCHEMAS, ids=[str(i) for i in range(len(JUNK_SCHEMAS))])
def test_junk_response_schemas_are_never_a_500(server: ServerHandle, schema: Any) -> None:
    for thinking in (None, {"type": "enabled", "budget_tokens": 1024}):
        fmt = {"format": {"type": "json_schema", "schema": schema}}
        payload = body(output_config=fmt, **({"thinking": thinking} if thinking else {}))
        assert_client_error_or_answer(post(server, "/v1/messages", payload))


def test_an_integer_past_pythons_limit_is_a_400_on_both_endpoints(server: ServerHandle) -> None:
    digits = b"7" * 5000
    for path, raw in (
        ("/v1/messages", b'{"model": "m", "max_tokens": ' + digits + b', "messages": []}'),
        ("/v1/messages/count_tokens", b'{"model": "m", "messages": [], "x": ' + digits + b"}"),
        (
            "/v1/messages",
            b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", '
            b'"content": [{"type": "tool_result", "tool_use_id": "t", "content": '
            + digits
            + b"}]}]}",
        ),
    ):
        response = post(server, path, raw)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    # The server is unharmed.
    assert post(server, "/v1/messages", body()).status_code == 200


def test_every_response_carries_a_request_id(server: ServerHandle) -> None:
    """Item 11: the SDKs show `request_id`; answers, errors, refusals and probes all have one."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)
    message = client.messages.create(
        model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert message._request_id and message._request_id.startswith("req_")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="m", max_tokens=2, messages=[])
    assert refused.value.request_id and refused.value.request_id.startswith("req_")
    seen = set()
    for response in (
        httpx.get(server.url + "/health", timeout=30),
        httpx.get(server.url + "/no-such-path", headers=HEADERS, timeout=30),
        httpx.post(server.url + "/v1/messages", content=b"{}", timeout=30),  # no token: 401
        httpx.get(server.url + "/health", headers={"host": "evil.example"}, timeout=30),
    ):
        request_id = response.headers.get("request-id", "")
        assert request_id.startswith("req_"), (response.status_code, response.headers)
        seen.add(request_id)
    assert len(seen) == 4  # one per response


def test_control_characters_from_a_request_never_reach_the_log(
    server: ServerHandle, tmp_path: Path
) -> None:
    """Item 11: a block `type` (or model name) holding escape codes and line breaks is logged
    escaped: it cannot recolour the operator's terminal or forge a log line."""
    from mlxlaunch.launch.server_log import logging_to

    log_file = tmp_path / "server.log"
    hostile = "\x1b[2J\x1b[31mred\nFAKE 12:00:00 status=200\x9b"
    with logging_to(log_file):
        refused = post(
            server,
            "/v1/messages",
            body(messages=[{"role": "user", "content": [{"type": hostile, "text": "x"}]}]),
        )
        answered = post(server, "/v1/messages", {**body(), "model": hostile})
    assert refused.status_code == 400 and answered.status_code in (200, 400)
    text = log_file.read_text()
    assert "\x1b" not in text and "\x9b" not in text
    assert "\\x1b[31mred\\nFAKE" in text  # shown, escaped
    assert not any(line.startswith("FAKE") for line in text.splitlines())


def test_a_final_user_turn_without_the_tool_results_is_a_400(server: ServerHandle) -> None:
    """Item 11: Anthropic refuses a tool_use whose result is not in the next user turn."""
    messages = [
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}],
        },
        {"role": "user", "content": "never mind"},
    ]
    tool = {"name": "t", "description": "d", "input_schema": {"type": "object"}}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = post(server, path, body(messages=messages, tools=[tool]))
        assert response.status_code == 400, response.text
        assert "toolu_1" in response.json()["error"]["message"]


def test_a_request_cut_short_is_logged_with_its_prompt(caplog: pytest.LogCaptureFixture) -> None:
    """Item 11: a cancelled request used to be logged as prompt=0 cached=0 after its prefill."""
    import logging

    from mlxlaunch.engine.types import Admitted
    from mlxlaunch.server.request_log import RequestLog

    record = RequestLog("msg_x", "m", 0.0)
    record.observe(Admitted("msg_x", prompt_tokens=82_000, cached_tokens=80_000, max_tokens=9))
    with caplog.at_level(logging.INFO, logger="mlxlaunch.server"):
        record.finish(499)
    assert "prompt=82000 cached=80000 output=0" in caplog.text and "status=499" in caplog.text


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": 5},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": None},
        {"type": "object", "properties": {"a": {"type": "object", "required": "a"}}},
        {"type": "object", "properties": [1, 2]},
    ],
    ids=["required-5", "required-null", "nested-required", "properties-list"],
)
def test_a_misshapen_tool_schema_is_a_400_naming_the_keyword_on_every_family(
    server: ServerHandle, schema: Any
) -> None:
    """Issue 35, item 10: some families answered these with a 200 (the schema reached the
    prompt as it was); now the wire refuses them on every family and every API."""
    keyword = "properties" if isinstance(schema.get("properties"), list) else "required"
    user = [{"role": "user", "content": "hi"}]
    function = {"name": "t", "description": "d", "parameters": schema}
    responses_tool = {"type": "function", **function}
    for path, payload in (
        ("/v1/messages", body(tools=[{"name": "t", "description": "d", "input_schema": schema}])),
        ("/v1/chat/completions", {"model": "m", "messages": user,
                                  "tools": [{"type": "function", "function": function}]}),
        ("/v1/responses", {"model": "m", "input": "hi", "tools": [responses_tool]}),
        ("/v1/messages", body(output_config={"format": {"type": "json_schema", "schema": schema}})),
    ):  # fmt: skip
        response = post(server, path, payload)
        assert response.status_code == 400, (path, response.text[:300])
        assert keyword in response.json()["error"]["message"], response.text[:300]
