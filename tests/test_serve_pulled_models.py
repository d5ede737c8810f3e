"""A model pulled once is found by `mlx serve` through the same store, and serving it never
asks the hub for anything (issue 6: "pull … then loads in `mlx serve`"; "a request for a model
that is not local never triggers a download from inside the server")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from cli_process import reaped, stop
from deadlines import PROCESS_START_S
from fakehub import TINY_REPO, FakeHub
from test_serve_cli import _read_announcement, _start_serve

from mlxlaunch.cli.main import main

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


def test_a_pulled_repo_is_served_by_its_id_without_asking_the_hub(hub: FakeHub) -> None:
    assert main(["models", "pull", TINY_REPO]) == 0
    asked_before = len(hub.requests)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLX_AUTH_TOKEN": "review-token-0123456789"}
    with reaped(_start_serve(TINY_REPO, env)) as proc:
        url, token, _ = _read_announcement(proc, time.monotonic() + PROCESS_START_S)
        assert token == "review-token-0123456789"
        body = {
            "model": "claude-x",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}],
        }
        response = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": token})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["output_tokens"] >= 1
        models = httpx.get(url + "/v1/models", headers={"x-api-key": token}).json()
        assert [m["id"] for m in models["data"]] == [TINY_REPO]  # the name it was served by
        err = stop(proc)
    assert proc.returncode == 0, err
    assert len(hub.requests) == asked_before, hub.requests[asked_before:]  # no hub traffic


def test_serving_a_repo_that_was_never_pulled_downloads_nothing(hub: FakeHub) -> None:
    asked_before = len(hub.requests)
    done = subprocess.run(
        [sys.executable, "-m", "mlxlaunch", "serve", "--model", TINY_REPO, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MLX_AUTH_TOKEN": "review-token-0123456789"},
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "mlx models pull" in done.stderr, done.stderr
    assert len(hub.requests) == asked_before  # the server side never downloads
