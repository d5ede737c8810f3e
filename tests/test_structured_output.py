"""Structured output and forced tool calls through the server, written by the random test model:
only the grammar constraint stands between its noise and the schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from engine_helpers import messages_tool, serve

from mlxlaunch.server.runner import ServerHandle

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 12}},
        "required": ["title"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "admin": {"type": "boolean"},
        },
        "required": ["name", "age", "admin"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 5},
                "maxItems": 3,
            },
        },
        "required": ["color", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "label": {"type": ["string", "null"], "maxLength": 6},
                },
                "required": ["x", "label"],
                "additionalProperties": False,
            }
        },
        "required": ["point"],
        "additionalProperties": False,
    },
]
GENERATIONS = 50
SEARCH_TOOL = messages_tool(
    "search",
    "Search the web",
    {
        "query": {"type": "string", "maxLength": 10},
        "limit": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    closed=True,
)
# Closed: else extra keys of any length are allowed too.
READ_TOOL = messages_tool(
    "read", "Read a file", {"path": {"enum": ["a.txt", "b.txt"]}}, closed=True
)


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerHandle]:
    with serve(tiny_model_dir, scripted=False, max_concurrency=4) as served:
        yield served.server


def _post(server: ServerHandle, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.url + "/v1/messages", json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _structured(schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {
        "model": "local",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }


def test_constrained_generations_are_valid_json(server: ServerHandle) -> None:
    bodies = [_structured(SCHEMAS[i % len(SCHEMAS)], 200) for i in range(GENERATIONS)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        messages = list(pool.map(lambda body: _post(server, body), bodies))
    outputs = set()
    for body, message in zip(bodies, messages, strict=True):
        assert message["stop_reason"] == "end_turn", message
        (block,) = message["content"]
        value = json.loads(block["text"])
        jsonschema.validate(value, body["output_config"]["format"]["schema"])
        outputs.add(block["text"])
    assert len(outputs) > len(SCHEMAS)  # sampled, not one fixed answer per schema


def test_a_constrained_output_cut_by_max_tokens_says_so(server: ServerHandle) -> None:
    schema = {
        "type": "object",
        "properties": {"essay": {"type": "string", "minLength": 200, "maxLength": 300}},
        "required": ["essay"],
    }
    message = _post(server, _structured(schema, 8))
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 8


def test_an_invalid_schema_is_a_400(server: ServerHandle) -> None:
    body = _structured({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, 20)
    response = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ({"type": "any"}, {"search", "read"}),
        ({"type": "tool", "name": "read"}, {"read"}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"search", "read"}),
    ],
    ids=["any", "tool", "any-single"],
)
def test_forced_tool_choice_always_yields_a_tool_call(
    server: ServerHandle, choice: dict[str, Any], names: set[str]
) -> None:
    client: Any = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    schemas = {t["name"]: t["input_schema"] for t in (SEARCH_TOOL, READ_TOOL)}
    for _ in range(6):
        message = client.messages.create(
            model="local",
            max_tokens=120,
            messages=[{"role": "user", "content": "find it"}],
            tools=[SEARCH_TOOL, READ_TOOL],
            tool_choice=choice,
        )
        calls = [b for b in message.content if b.type == "tool_use"]
        # A random model may keep adding parallel calls until max_tokens cuts the next one;
        # the calls it completed are still there. With one call allowed it must end cleanly.
        if choice.get("disable_parallel_tool_use") or message.stop_reason != "max_tokens":
            assert message.stop_reason == "tool_use", message
        assert calls and all(b.type == "tool_use" for b in message.content)
        if choice.get("disable_parallel_tool_use"):
            assert len(calls) == 1
        for call in calls:
            assert call.type == "tool_use" and call.name in names
            jsonschema.validate(call.input, schemas[call.name])
