"""Property-based fuzzing of `POST /v1/messages` and `/v1/messages/count_tokens`.

Random JSON, mutated valid requests (values swapped for random ones, wrong types, deleted
keys, huge strings, deep nesting) and raw garbage go to the real server with the tiny model.
The property: never a 5xx, always the Anthropic envelope with the status its type implies,
no `api_error` inside a stream, and the server answers a valid request afterwards.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from stream_grammar import check_stream

from mlxlaunch.protocol.errors import ERROR_STATUS
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.sse import parse_frames

TOKEN = "fuzz-token"
ENDPOINTS = ("/v1/messages", "/v1/messages/count_tokens")
# Generation is the engine's business (other tests); here it only has to not break. Valid
# bodies are held to a few output tokens so every example stays fast.
MAX_FUZZ_OUTPUT = 4
FUZZ_SETTINGS = settings(
    max_examples=examples(120),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

BASH = {
    "name": "Bash",
    "description": "Run a command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
VALID_BODIES: list[dict[str, Any]] = [
    {
        "model": "claude-sonnet-4-5",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}],
    },
    {
        "model": "claude-haiku-4-5-20251001",
        "max_tokens": 3,
        "stream": True,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "tools": [BASH],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "use ls", "signature": "x"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                    {"type": "text", "text": "and now?"},
                ],
            },
        ],
    },
    {
        "model": "mlx-community/Qwen3-4B-4bit",
        "max_tokens": 4,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["\n\nHuman:", "END"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "u"},
        "messages": [
            {"role": "user", "content": "think"},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "mid-conversation note"},
            {"role": "user", "content": "go"},
        ],
    },
    {
        "model": "claude-x",
        "max_tokens": 4,
        "output_config": {
            "format": {
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "properties": {"title": {"type": "string"}},
                    "required": ["title"],
                    "additionalProperties": False,
                },
            }
        },
        "messages": [{"role": "user", "content": "title?"}],
    },
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["text", "tool_use", "tool_result", "user", "assistant", "enabled", ""])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.sampled_from(["type", "text", "content"]), children, max_size=4
        )
    ),
    max_leaves=12,
)


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


special_values = st.one_of(
    st.integers(min_value=1, max_value=4).map(lambda n: "x" * (10 ** (n + 2))),  # up to 1 MB
    # Deeper than the encoder's recursion limit is sent as raw bytes in test_security.py.
    st.sampled_from([10, 63, 65, 300, 900]).map(_deep),
    st.sampled_from([-1, 0, 2**31, 2**63, 10**30, 1e308, -0.0, 1.5]),
    st.sampled_from(["/etc/passwd", "https://example.com/m", "~/.ssh", "../x", "a/b/c"]),
)


def _paths(body: Any, max_depth: int = 12) -> list[tuple[Any, ...]]:
    """Paths to mutate (not below `max_depth`: an inserted deep value is mutated as a whole)."""
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(body, ())]
    while stack:
        node, prefix = stack.pop()
        found.append(prefix)
        if len(prefix) >= max_depth:
            continue
        if isinstance(node, dict):
            stack.extend((child, (*prefix, key)) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, (*prefix, index)) for index, child in enumerate(node))
    return found


def _mutate(body: Any, path: tuple[Any, ...], op: str, value: Any) -> Any:
    if not path:
        return value if op != "delete" else {}
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    current = parent[last]
    if op == "delete":
        del parent[last]
    elif op == "wrap":
        parent[last] = [current] if not isinstance(current, list) else {"v": current}
    elif op == "stringify":
        parent[last] = json.dumps(current)
    elif op == "insert" and isinstance(current, list):
        current.append(value)
    elif op == "insert" and isinstance(current, dict):
        current["fuzz"] = value
    else:
        parent[last] = value
    return body


def test_seed_bodies_are_valid() -> None:
    # Mutations start from these; one the validator refuses would leave the 200 path unfuzzed.
    for body in VALID_BODIES:
        MessagesRequest.model_validate(body)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Any:
    body: Any = copy.deepcopy(draw(st.sampled_from(VALID_BODIES)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(body)))
        op = draw(st.sampled_from(["replace", "delete", "wrap", "stringify", "insert", "special"]))
        value = draw(special_values if op == "special" else json_values)
        body = _mutate(body, path, op, value)
    return body


@pytest.fixture(scope="module")
def fuzz_target(
    tiny_model_dir: Path, pytestconfig: pytest.Config
) -> Iterator[tuple[httpx.Client, Counter[str]]]:
    statuses: Counter[str] = Counter()
    with serve(tiny_model_dir, token=TOKEN, scripted=False) as served:
        headers = {"x-api-key": TOKEN, "content-type": "application/json"}
        with httpx.Client(base_url=served.server.url, headers=headers, timeout=120) as client:
            yield client, statuses
            _assert_still_serving(client)
            stats = served.engine.stats()
            assert stats.running == 0 and stats.queue_depth == 0
    summary = f"fuzz: {sum(statuses.values())} requests, outcomes {dict(sorted(statuses.items()))}"
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + summary)


def _assert_still_serving(client: httpx.Client) -> None:
    response = client.post("/v1/messages", json=VALID_BODIES[0])
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"


def _bounded(body: Any) -> Any:
    if isinstance(body, dict):
        tokens = body.get("max_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > MAX_FUZZ_OUTPUT:
            body["max_tokens"] = MAX_FUZZ_OUTPUT
    return body


def _check(client: httpx.Client, statuses: Counter[str], endpoint: str, content: bytes) -> None:
    response = client.post(endpoint, content=content)
    status = response.status_code
    assert status < 500, f"{status} for {content[:300]!r}: {response.text[:500]}"
    if status >= 400:
        error = response.json()
        assert error["type"] == "error", error
        assert ERROR_STATUS[error["error"]["type"]] == status, error
        assert error["error"]["message"]
        statuses[f"{status} {error['error']['type']}"] += 1
        return
    assert status == 200
    if response.headers["content-type"].startswith("text/event-stream"):
        summary = check_stream(parse_frames(response.text))
        assert summary.error is None or summary.error["type"] != "api_error", summary.error
        statuses["200 stream"] += 1
    else:
        data = response.json()
        assert data.get("type") == "message" or isinstance(data.get("input_tokens"), int), data
        statuses["200"] += 1


@pytest.mark.slow
@FUZZ_SETTINGS
@given(body=mutated_bodies(), endpoint=st.sampled_from(ENDPOINTS))
def test_mutated_valid_requests(
    fuzz_target: tuple[httpx.Client, Counter[str]], body: Any, endpoint: str
) -> None:
    client, statuses = fuzz_target
    _check(client, statuses, endpoint, json.dumps(_bounded(body)).encode())


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=examples(50))
@given(body=json_values, endpoint=st.sampled_from(ENDPOINTS))
def test_random_json(
    fuzz_target: tuple[httpx.Client, Counter[str]], body: Any, endpoint: str
) -> None:
    client, statuses = fuzz_target
    _check(client, statuses, endpoint, json.dumps(body).encode())


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=examples(30))
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_garbage_bytes(fuzz_target: tuple[httpx.Client, Counter[str]], raw: bytes) -> None:
    client, statuses = fuzz_target
    _check(client, statuses, ENDPOINTS[0], raw)
