"""The restart workload's timing rules, with a stand-in server (the real processes are covered
by the `mlx bench --quick` smoke test)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mlxlaunch.bench.clients import StreamTiming
from mlxlaunch.bench.restart import RestartFailed, ServeProcess, measure_restart
from mlxlaunch.bench.workloads import Conversation, short_chat


class StandInServer:
    def __init__(self, ready_after_s: float, fail: bool = False) -> None:
        self.ready_after_s = ready_after_s
        self.fail = fail
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        time.sleep(self.ready_after_s)
        if self.fail:
            raise RestartFailed("did not come up")
        self.events.append("ready")

    def stop(self) -> None:
        self.events.append("stop")


class StandInTarget:
    name = "stand-in"

    def __init__(self, server: StandInServer) -> None:
        self.server = server

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming:
        self.server.events.append("request")
        return StreamTiming(ttft_s=0.01, total_s=0.02, prompt_tokens=10, cached_tokens=8)

    async def aclose(self) -> None:
        self.server.events.append("closed")


@pytest.mark.parametrize(("ready_after_s", "wait_s"), [(0.0, 0.3), (0.3, 0.0)])
async def test_the_request_goes_out_after_the_wait_and_once_the_server_is_ready(
    ready_after_s: float, wait_s: float
) -> None:
    server = StandInServer(ready_after_s)
    result = await measure_restart(
        server,
        lambda: StandInTarget(server),
        short_chat(0),
        max_tokens=4,
        wait_s=wait_s,
        ready_timeout_s=5,
    )
    assert server.events == ["start", "ready", "request", "closed", "stop"]
    assert result["sent_s"] >= max(wait_s, ready_after_s) and result["ready_s"] >= ready_after_s
    assert result["ttft_s"] == 0.01 and result["cached_tokens"] == 8


async def test_a_server_that_does_not_come_up_is_stopped_and_reported() -> None:
    server = StandInServer(0.0, fail=True)
    with pytest.raises(RestartFailed):
        await measure_restart(
            server,
            lambda: StandInTarget(server),
            short_chat(0),
            max_tokens=4,
            wait_s=0,
            ready_timeout_s=5,
        )
    assert server.events == ["start", "stop"]


def test_ours_restarts_as_a_user_runs_it(tmp_path: Path) -> None:
    process = ServeProcess(
        "/models/m", cache_dir=tmp_path, auth_token="t0k", extra_args=("--max-concurrency", "8")
    )
    command = process.command()
    assert command[1:4] == ["-m", "mlxlaunch", "serve"]
    for flag, value in [("--model", "/models/m"), ("--port", "0"), ("--cache-dir", str(tmp_path)),
                        ("--auth-token", "t0k"), ("--max-concurrency", "8")]:  # fmt: skip
        assert command[command.index(flag) + 1] == value
