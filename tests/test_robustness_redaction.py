"""Issue 19, item 10: a client reading `/v1/stats` (or `mlx dash`) sees no other client's prompt
text and no filesystem path; the server log carries no prompt text either. Only a server
started with `--debug-cache` shares the text around a cache miss, in all three places.

Each test runs a real `mlx --debug serve` (debug logs on: every log line the server writes is
in its stderr) on the tiny test model. Client A sends a prompt with a secret in its system
prompt; client B sends one that shares A's opening and then differs just before the secret, so
B's cache miss is judged against A's prompt and the text after the divergence in the sequence
the cache held is A's secret. Then B reads everything it may read: `/v1/stats`, its stream,
`/metrics`, `/v1/models`, `/health`, and what the dashboard's panels show of a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from deadlines import PROCESS_EXIT_S, PROCESS_START_S
from rich.text import Text

from mlxlaunch.dash.feed import ServerAddress, StatsFeed
from mlxlaunch.dash.panels import cache_card, miss_text, model_card, request_cells, requests_card
from mlxlaunch.engine.cache.prefix import CacheSettings
from mlxlaunch.launch.serving import EngineOptions
from mlxlaunch.protocol.stats import STATS_EVENT, StatsSnapshot

pytestmark = pytest.mark.slow

SECRET = "hunter2-Qz7xK"
# Claude Code's main agent opens so; with a client tool the request counts as `main`, and a
# miss that loses most of its prompt is logged at WARNING.
OPENING = "You are an interactive agent that helps users with software engineering tasks. " + (
    " ".join(f"Rule {i}: read the file before you edit it." for i in range(12))
)
TAIL = " ".join(f"Guideline {i}: keep answers short and cite the line you mean." for i in range(40))
SYSTEM_A = OPENING + f" The deploy password is {SECRET}; never print it. " + TAIL
SYSTEM_B = OPENING + " The weather today is fine and nothing here is private. " + TAIL
TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
# `--debug-cache` reaches the engine through launch/serving.py's EngineOptions, and its miss
# tracker through the prefix cache's settings (issue 19: wired by their owners).
DEBUG_CACHE_WIRED = "debug_cache" in {f.name for f in dataclasses.fields(EngineOptions)} and (
    "excerpts" in {f.name for f in dataclasses.fields(CacheSettings)}
)


@dataclass
class Seen:
    """What client B could read, and what the server wrote to its terminal."""

    bodies: dict[str, str]  # route (or "dash") -> the text B got
    snapshot: StatsSnapshot
    log: str  # the server's stderr: every log line, at debug level


@contextlib.contextmanager
def mlx_serve(model_dir: Path, *flags: str) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """`mlx --debug serve --model MODEL_DIR` on a free port: (url, token, process)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_AUTH_TOKEN", None)
    command = [sys.executable, "-m", "mlxlaunch", "--debug", "serve", "--model", str(model_dir)]
    proc = subprocess.Popen(
        [*command, "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url, token = _announced(proc, time.monotonic() + PROCESS_START_S)
        yield url, token, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _announced(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str]:
    assert proc.stdout is not None
    url = token = None
    while url is None or token is None:
        assert time.monotonic() < deadline, "mlx serve did not announce itself in time"
        line = proc.stdout.readline()
        if not line:
            assert proc.poll() is None, f"mlx serve exited with {proc.returncode}"
            continue
        if match := re.search(r"serving \S+ at (http://\S+)", line):
            url = match.group(1)
        if match := re.match(r"export ANTHROPIC_AUTH_TOKEN=(\S+)", line):
            token = match.group(1).strip("'")
    return url, token


def ask(url: str, token: str, system: str) -> None:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 2,
        "temperature": 0,
        "system": system,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "Deploy the service."}],
    }
    response = httpx.post(
        url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=120
    )
    assert response.status_code == 200, response.text


def dash_text(snapshot: StatsSnapshot) -> str:
    """All the dashboard's panels show of `snapshot`, as plain text."""
    panels = [requests_card(snapshot), model_card(snapshot), cache_card(snapshot)]
    panels.append(miss_text(snapshot.cache.last_miss))
    panels += [" ".join(request_cells(row)) for row in snapshot.recent]
    return "\n".join(Text.from_markup(panel).plain for panel in panels)


def first_stream_event(url: str, headers: dict[str, str]) -> str:
    with httpx.stream("GET", url + "/v1/stats/stream", headers=headers, timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                return line
    raise AssertionError(f"no {STATS_EVENT} event")


def two_clients(model_dir: Path, cache_dir: Path, *flags: str) -> Seen:
    """A sends its secret, B then a prompt that breaks from A's just before it; B reads all.
    The saved prefixes go to `cache_dir`: another run's would turn B's miss into a hit."""
    with mlx_serve(model_dir, "--cache-dir", str(cache_dir), *flags) as (url, token, proc):
        ask(url, token, SYSTEM_A)  # client A
        ask(url, token, SYSTEM_B)  # client B (another client with the same token)
        headers = {"x-api-key": token}
        bodies = {
            route: httpx.get(url + route, headers=headers, timeout=30).text
            for route in ("/v1/stats", "/metrics", "/v1/models", "/v1/models/anything", "/health")
        }
        bodies["/v1/stats/stream"] = first_stream_event(url, headers)
        snapshot = asyncio.run(StatsFeed(ServerAddress(url, token)).fetch())
        bodies["dash"] = dash_text(snapshot)
        proc.send_signal(signal.SIGINT)
        _, log = proc.communicate(timeout=PROCESS_EXIT_S)
    return Seen(bodies, snapshot, log)


def miss_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "left its nearest earlier prompt" in line]


def test_no_client_sees_another_clients_prompt_or_the_model_path(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    seen = two_clients(tiny_model_dir, tmp_path)
    miss = seen.snapshot.cache.last_miss
    assert miss is not None and miss.kind == "main"  # B's miss, against A's prompt
    assert miss.excerpts is None
    assert all(re.fullmatch(r"[0-9a-f]{8}", d) for d in (miss.digests.cached, miss.digests.request))
    assert miss.digests.cached != miss.digests.request
    assert "digests" in seen.bodies["dash"] and "--debug-cache" in seen.bodies["dash"]
    for where, text in seen.bodies.items():
        assert SECRET not in text and "password" not in text, where
        assert "weather" not in text and "Guideline" not in text, where  # B's own words too
        assert str(tiny_model_dir) not in text and str(tiny_model_dir.parent) not in text, where
    assert seen.snapshot.model.name == tiny_model_dir.name  # shown by its name
    (line,) = miss_lines(seen.log)  # the miss was logged, by position and digests
    assert f"cached #{miss.digests.cached}" in line
    assert SECRET not in seen.log and "password" not in seen.log


@pytest.mark.skipif(not DEBUG_CACHE_WIRED, reason="--debug-cache not yet wired to the miss tracker")
def test_under_debug_cache_the_miss_shows_the_text_around_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    seen = two_clients(tiny_model_dir, tmp_path, "--debug-cache")
    miss = seen.snapshot.cache.last_miss
    assert miss is not None and miss.excerpts is not None
    assert SECRET in miss.excerpts.cached and "weather" in miss.excerpts.request
    for where in ("/v1/stats", "/v1/stats/stream", "dash"):
        assert SECRET in seen.bodies[where], where
    (line,) = miss_lines(seen.log)
    assert SECRET in line and f"cached #{miss.digests.cached}" in line
    for where, text in seen.bodies.items():  # the flag shares text, never the path
        assert str(tiny_model_dir) not in text, where
