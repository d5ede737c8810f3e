"""Ctrl-C on `mlx serve` while a client streams: the client gets an error event, the terminal
no traceback, and the process exits promptly."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from deadlines import PROCESS_EXIT_S, PROCESS_START_S
from scripted_mlx import scripted_mlx_command, write_script
from test_serve_cli import _read_announcement, _start_serve

from mlxlaunch.launch.serving import DRAIN_S
from mlxlaunch.server.drain import SHUTDOWN_MESSAGE

pytestmark = pytest.mark.slow


def test_ctrl_c_mid_stream_sends_an_error_event_and_prints_no_traceback(tmp_path: Path) -> None:
    # A scripted reply far longer than the drain (random weights may stop at any token).
    script = write_script(tmp_path / "script.json", ["word " * 20_000])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_AUTH_TOKEN", None)
    proc = _start_serve("tiny", env, mlx=scripted_mlx_command(script))
    events: list[tuple[str, str]] = []
    interrupted_at = 0.0
    try:
        url, token, _ = _read_announcement(proc, time.monotonic() + PROCESS_START_S)
        body = {
            "model": "claude-x",
            "max_tokens": 30_000,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"x-api-key": token}
        with httpx.stream(
            "POST", url + "/v1/messages", json=body, headers=headers, timeout=PROCESS_EXIT_S
        ) as response:
            assert response.status_code == 200
            name = ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((name, line.removeprefix("data: ")))
                    if name == "content_block_delta" and not interrupted_at:
                        proc.send_signal(signal.SIGINT)
                        interrupted_at = time.monotonic()
        _, err = proc.communicate(timeout=PROCESS_EXIT_S)
        stop_s = time.monotonic() - interrupted_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    names = [n for n, _ in events]
    assert names[-1] == "error", names[-5:]
    assert "message_stop" not in names
    assert json.loads(events[-1][1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": SHUTDOWN_MESSAGE},
    }
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "CancelledError" not in err, err
    assert "Ctrl-C again" in err and "stopped" in err
    assert DRAIN_S <= stop_s < PROCESS_EXIT_S  # the request had the whole drain to finish
