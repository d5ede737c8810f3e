"""On a live server (tiny model, real socket): the captured Claude Code requests
without streaming, their token counts, and what the request log says about refusals."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import served_engine

from mlxlaunch.server.runner import ServerHandle

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOKEN = "review-token-abcdef0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CAPTURED = ["print-mode-request.json", "title-request.json", "tool-result-request.json"]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerHandle]:
    with served_engine(tiny_model_dir, TOKEN) as (_, handle):
        yield handle


def _captured(fixtures_dir: Path, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    captured = json.loads((fixtures_dir / name).read_text())
    skip = ("content-length", "host", "authorization", "accept-encoding", "connection")
    headers = {k: v for k, v in (captured.get("headers") or {}).items() if k.lower() not in skip}
    return captured["body"], {**headers, **AUTH}


@pytest.mark.parametrize("name", CAPTURED)
def test_captured_requests_as_json_count_what_they_prefill(
    server: ServerHandle, fixtures_dir: Path, name: str
) -> None:
    body, headers = _captured(fixtures_dir, name)
    counted = httpx.post(
        server.url + "/v1/messages/count_tokens?beta=true",
        json={k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")},
        headers=headers,
        timeout=120,
    )
    assert counted.status_code == 200, counted.text
    response = httpx.post(
        server.url + "/v1/messages?beta=true",
        json={**body, "stream": False, "max_tokens": 6},
        headers=headers,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["type"] == "message" and message["model"] == body["model"]
    assert message["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    usage = message["usage"]
    prefilled = usage["input_tokens"] + usage["cache_read_input_tokens"]
    counts = counted.json()
    assert counts["input_tokens"] == prefilled
    if "context_management" in body:  # Claude Code's own edit, counted as the API does
        assert counts["context_management"] == {"original_input_tokens": prefilled}
    else:
        assert counts == {"input_tokens": prefilled}
    assert response.headers["x-cached-tokens"] == str(usage["cache_read_input_tokens"])


def test_refused_bodies_get_one_log_line_without_the_token(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlxlaunch.server")
    bad = {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = httpx.post(server.url + path, content=b"{nope", headers=AUTH, timeout=30)
        assert response.status_code == 400
    assert httpx.post(server.url + "/v1/messages", json=bad, headers=AUTH).status_code == 400
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxlaunch.server"]
    refused = [line for line in lines if " refused: status=400 " in line]
    assert len(refused) == 3, lines
    assert any(
        line.startswith("POST /v1/messages refused") and "max_tokens" in line for line in refused
    )
    assert all(TOKEN not in line for line in lines)
