"""`mlx serve --model demo` as a user runs it: a subprocess, a real request, Ctrl-C.

Its Ctrl-C case is one of the quick tier's smoke tests (tests/tiers.py): the real `mlx serve`
on a real socket, a built test model, the Anthropic SDK as the client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx
import pytest
from deadlines import PROCESS_EXIT_S, PROCESS_START_S

from mlxlaunch.launch.state import running_servers
from mlxlaunch.testing import DEMO_NOTICE


def _start_serve(
    model: str, env: dict[str, str], mlx: list[str] | None = None, *options: str
) -> subprocess.Popen[str]:
    """`mlx serve --model MODEL` on any free port, in a child process with `env`; `mlx` is the
    command that runs it (default: `python -m mlxlaunch`; tests/scripted_mlx.py scripts it)."""
    command = [*(mlx or [sys.executable, "-m", "mlxlaunch"]), "serve", "--model", model]
    return subprocess.Popen(
        [*command, "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_announcement(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str, str]:
    """Read stdout until the announcement ends; return the URL, the token and all it said."""
    assert proc.stdout is not None
    url = token = None
    said: list[str] = []
    while url is None or token is None or "Press Ctrl-C" not in said[-1]:
        assert time.monotonic() < deadline, "mlx serve did not announce itself in time"
        line = proc.stdout.readline()
        if not line:
            assert proc.poll() is None, f"mlx serve exited with {proc.returncode}"
            continue
        said.append(line)
        if match := re.search(r"serving \S+ at (http://\S+)", line):
            url = match.group(1)
        if match := re.match(r"export ANTHROPIC_AUTH_TOKEN=(\S+)", line):
            token = match.group(1).strip("'")
    return url, token, "".join(said)


@pytest.mark.parametrize(
    "stop_signal",
    [
        pytest.param(signal.SIGINT, marks=pytest.mark.quick),  # the smoke test
        pytest.param(signal.SIGTERM, marks=pytest.mark.slow),
    ],
)
def test_serve_demo_answers_and_stops(tmp_path: Path, stop_signal: signal.Signals) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_AUTH_TOKEN", None)
    proc = _start_serve("demo", env)
    try:
        url, token, announcement = _read_announcement(proc, time.monotonic() + PROCESS_START_S)
        assert len(token) >= 32  # generated, not a fixed default
        assert any(s.url == url and s.kind == "serve" for s in running_servers())
        body = {
            "model": "claude-x",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }
        response = httpx.post(
            url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=60
        )
        assert response.status_code == 200
        assert response.json()["model"] == "claude-x"
        assert httpx.post(url + "/v1/messages", json=body, timeout=10).status_code == 401
        sdk = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0)
        with sdk.messages.stream(model="claude-y", max_tokens=4, messages=body["messages"]) as s:
            streamed = s.get_final_message()  # the SDK's accumulator checks the event order
        assert streamed.model == "claude-y" and streamed.stop_reason in ("end_turn", "max_tokens")
        assert 1 <= streamed.usage.output_tokens <= 4
        proc.send_signal(stop_signal)
        _, err = proc.communicate(timeout=PROCESS_EXIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "mlx dash" in announcement  # tells the user how to watch it live
    flat_err = " ".join(err.split())
    assert DEMO_NOTICE.split(":")[0] in flat_err
    assert re.search(r"msg_\w+ model=claude-x prompt=\d+ .*status=200", err)
    assert token not in err  # the request log never shows the token
    assert not any(s.url == url for s in running_servers())
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)


@contextmanager
def _serving(model: str, *options: str) -> Iterator[subprocess.Popen[str]]:
    """`mlx serve` of `model` with `options`, killed on the way out if still running."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_AUTH_TOKEN", None)
    proc = _start_serve(model, env, None, *options)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_serve_with_8_bit_kv_and_a_small_window_answers_reuses_and_refuses_past_it() -> None:
    options = ("--kv-bits", "8", "--context-length", "4096", "--cache-disk", "0")
    with _serving("tiny", *options) as proc:
        url, token, _ = _read_announcement(proc, time.monotonic() + PROCESS_START_S)
        sdk = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0)
        messages: list[anthropic.types.MessageParam] = [
            {"role": "user", "content": "Read the parser and fix the bug. " * 30}
        ]
        first = sdk.messages.create(model="m", max_tokens=4, messages=messages)
        again = sdk.messages.create(model="m", max_tokens=4, messages=messages)
        assert first.usage.output_tokens >= 1
        assert (again.usage.cache_read_input_tokens or 0) > 0  # its quantized prefix reused
        stats = httpx.get(url + "/v1/stats", headers={"x-api-key": token}, timeout=10).json()
        assert stats["memory"]["kv_bits"] == 8
        assert stats["memory"]["kv_cache_bytes"] >= stats["cache"]["bytes"] > 0
        too_long = r"prompt is too long: \d+ tokens > 4096"
        with pytest.raises(anthropic.BadRequestError, match=too_long):
            long_prompt: list[anthropic.types.MessageParam] = [
                {"role": "user", "content": "word " * 5000}
            ]
            sdk.messages.create(model="m", max_tokens=4, messages=long_prompt)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=PROCESS_EXIT_S)
    assert proc.returncode == 0, err
    assert "--context-length 4096 is below 16384" in " ".join(err.split())  # warned, served
