"""`mlx ps` and `mlx stop`: real servers listed and stopped; stale records never shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_process import MLX, run_mlx
from deadlines import PROCESS_EXIT_S, PROCESS_START_S
from e2e.claude_cli import write_fake_claude
from rich.console import Console
from test_launch_cli import _mlx_on_a_terminal
from test_serve_cli import _read_announcement, _start_serve

from mlxlaunch.cli.ps import ServerRow, print_servers, rows_json, server_rows
from mlxlaunch.launch.processes import (
    ProcessFacts,
    ServerNotFound,
    WhichServer,
    is_running,
    live_servers,
    model_label,
    process_facts,
    select_servers,
    stop_server,
)
from mlxlaunch.launch.state import RunState, state_path, write_state
from mlxlaunch.protocol.stats import ModelStatus, StatsSnapshot


def _state(pid: int, model: str = "demo", **changes: object) -> RunState:
    fields: dict[str, object] = {
        "pid": pid,
        "url": f"http://127.0.0.1:{40000 + pid % 1000}",
        "token": "secret-token",
        "model": model,
        "model_path": "/m",
        "log_file": "",
        "kind": "serve",
        "started_at": time.time(),
    }
    fields.update(changes)
    return RunState(**fields)  # type: ignore[arg-type]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _is_zombie(pid: int) -> bool:
    facts = process_facts(pid)
    return facts is not None and facts.zombie


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


# --- which records are running servers --------------------------------------------------------


@pytest.mark.quick
def test_stale_reused_and_zombie_records_are_not_shown_and_are_removed(tmp_path: Path) -> None:
    live = write_state(_state(os.getpid(), started_at=time.time()), tmp_path)
    dead = write_state(_state(_dead_pid()), tmp_path)
    # Our parent is alive, but it started long after this record says its server did: the pid
    # was given to another process, which `mlx stop` must never signal.
    reused = write_state(_state(os.getppid(), started_at=1000.0), tmp_path)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while not _is_zombie(zombie.pid):
            time.sleep(0.02)
        zombie_record = write_state(_state(zombie.pid), tmp_path)
        assert [s.pid for s in live_servers(tmp_path)] == [os.getpid()]
    finally:
        zombie.wait()
    assert live.exists()
    assert not dead.exists() and not reused.exists() and not zombie_record.exists()


@pytest.mark.quick
def test_process_facts_of_this_process() -> None:
    facts = process_facts(os.getpid())
    assert facts is not None and not facts.zombie
    assert facts.rss_bytes is not None and facts.rss_bytes > 1_000_000
    assert facts.started_at is not None and facts.started_at <= time.time()
    assert process_facts(_dead_pid()) is None


def test_a_record_without_a_start_time_is_trusted() -> None:
    facts = ProcessFacts(rss_bytes=1, started_at=time.time(), zombie=False)
    assert is_running(_state(1, started_at=0.0), lambda pid: facts)
    assert not is_running(_state(1, started_at=1000.0), lambda pid: facts)
    assert not is_running(_state(1), lambda pid: None)


# --- which servers `mlx stop` means -----------------------------------------------------------


def test_selecting_servers_to_stop() -> None:
    a = _state(101, "qwen-coder-7b")
    b = _state(102, "/models/my-model", kind="launch")
    c = _state(103, "qwen-coder-7b")
    with pytest.raises(ServerNotFound, match="no mlx server is running"):
        select_servers([])
    assert select_servers([a]) == [a]
    with pytest.raises(WhichServer) as raised:
        select_servers([a, b])
    assert raised.value.servers == [a, b] and "mlx stop --all" in (raised.value.hint or "")
    assert select_servers([a, b], "102") == [b]
    assert select_servers([a, b], "my-model") == [b]  # a path's last part
    assert select_servers([a, b], a.url + "/") == [a]
    with pytest.raises(WhichServer):
        select_servers([a, b, c], "qwen-coder-7b")
    assert select_servers([a, b, c], "qwen-coder-7b", every=True) == [a, c]
    assert select_servers([a, b, c], every=True) == [a, b, c]
    with pytest.raises(ServerNotFound, match="'999'"):
        select_servers([a, b], "999")
    assert model_label("/models/my-model/") == "my-model" and model_label("org/m") == "org/m"


@pytest.mark.quick
def test_stop_waits_for_the_exit_and_gives_up_after_the_timeout(
    sleeper: subprocess.Popen[bytes],
) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        kept = stop_server(_state(stubborn.pid), timeout_s=0.5)
        assert not kept.stopped and kept.waited_s >= 0.5 and stubborn.poll() is None
    finally:
        stubborn.kill()
        stubborn.wait()
    # Its parent (us) has not reaped it yet when it exits: a zombie counts as stopped.
    done = stop_server(_state(sleeper.pid), timeout_s=PROCESS_EXIT_S)
    assert done.stopped and done.waited_s < PROCESS_EXIT_S
    assert sleeper.wait(timeout=PROCESS_EXIT_S) == -signal.SIGTERM
    # A record whose process is gone is not signalled, and counts as stopped.
    assert stop_server(_state(_dead_pid())).stopped


# --- how `mlx ps` shows them ------------------------------------------------------------------


def _render(rows: list[ServerRow], width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    print_servers(console, rows)
    return console.export_text().splitlines()


def test_rows_fit_80_columns_and_carry_no_token() -> None:
    states = [
        _state(4242424, "mlx-community/Qwen2.5-7B", kind="launch", started_at=time.time() - 3725),
        _state(77, "/a/very/long/path/to/models/qwen-coder-7b"),
    ]
    facts = {4242424: ProcessFacts(5_300_000_000, 0.0, False), 77: None}
    stats = {4242424: StatsSnapshot(running=2, queue_depth=1), 77: None}
    rows = server_rows(states, facts=facts.get, stats=lambda s: stats[s.pid])
    assert (rows[0].rss_bytes, rows[0].requests_running, rows[0].requests_queued) == (
        5_300_000_000,
        2,
        1,
    )
    assert rows[1].rss_bytes is None and rows[1].requests_running is None
    lines = _render(rows, 80)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    for expected in ("4242424", "launch", "mlx-community/Qwen2.5-7B", "qwen-coder-7b", "4.9 GiB"):
        assert expected in text
    assert "2+1" in text and "1h02m" in text
    assert "secret-token" not in json.dumps(rows_json(rows))
    narrow = _render(rows, 50)  # too narrow for the table: a block per server
    assert max(len(line) for line in narrow) <= 50 and "4242424" in "\n".join(narrow)


def test_a_model_served_beside_the_main_one_shows_with_its_role_and_failure() -> None:
    state = _state(4242, "qwen3-coder-30b", kind="launch", started_at=time.time() - 60)
    main = StatsSnapshot(model=ModelStatus(name="qwen3-coder-30b", state="loaded"))
    small = StatsSnapshot(model=ModelStatus(name="qwen3-4b", state="loaded"), role="small")
    broken = StatsSnapshot(model=ModelStatus(name="nope"), role="extra", failure="not downloaded")
    snapshot = StatsSnapshot(running=1, models=(main, small, broken))
    rows = server_rows([state], facts=lambda pid: None, stats=lambda s: snapshot)
    text = "\n".join(_render(rows, 120))
    assert "qwen3-coder-30b + qwen3-4b (haiku) + nope (extra: failed)" in text
    blocks = "\n".join(_render(rows, 40))  # the block layout says why it failed
    assert "not downloaded" in blocks
    assert rows_json(rows)[0]["also"][0] == {
        "name": "qwen3-4b",
        "role": "small",
        "state": "loaded",
        "failure": None,
    }
    alone = server_rows([state], facts=lambda pid: None, stats=lambda s: main)
    assert rows_json(alone)[0]["also"] == ()


# --- real servers ----------------------------------------------------------------------------


def _mlx(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_mlx(args, env, PROCESS_EXIT_S)


def _wait_for_record(home: Path, pid: int) -> None:
    deadline = time.monotonic() + PROCESS_START_S
    while not state_path(pid, home).exists():
        assert time.monotonic() < deadline, "the server never wrote its record"
        time.sleep(0.1)


@pytest.mark.slow
def test_ps_lists_real_servers_and_stop_stops_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))},
        "MLXLAUNCH_HOME": str(home),
        "MLXLAUNCH_CONFIG_DIR": str(tmp_path / "config"),
        "PYTHONUNBUFFERED": "1",
        "FAKE_CLAUDE_REPORT": str(tmp_path / "report.json"),
    }
    env.pop("MLX_AUTH_TOKEN", None)
    serve = _start_serve("tiny", env)
    claude = write_fake_claude(tmp_path / "bin")
    launch = subprocess.Popen(
        [*MLX, "launch", "claude", "-m", "tiny", "--claude-bin", str(claude), "--", "wait-signal"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url, token, _ = _read_announcement(serve, time.monotonic() + PROCESS_START_S)
        _wait_for_record(home, launch.pid)

        listed = _mlx(["ps", "--json"], env)
        assert listed.returncode == 0, listed.stderr
        assert token not in listed.stdout
        servers = {s["pid"]: s for s in json.loads(listed.stdout)}
        assert set(servers) == {serve.pid, launch.pid}
        served = servers[serve.pid]
        assert (served["kind"], served["model"], served["url"]) == ("serve", "tiny", url)
        assert served["rss_bytes"] > 10_000_000 and served["uptime_s"] >= 0
        assert served["requests_running"] == 0  # it answered GET /v1/stats with its token
        assert servers[launch.pid]["kind"] == "launch"
        table = _mlx(["ps"], {**env, "COLUMNS": "80"})
        assert str(serve.pid) in table.stdout and str(launch.pid) in table.stdout
        assert max(len(line) for line in table.stdout.splitlines()) <= 80

        # Two running and no terminal to ask on: it lists them and stops nothing.
        which = _mlx(["stop"], env)
        assert which.returncode == 2 and "2 servers are running" in which.stderr
        assert serve.poll() is None and launch.poll() is None

        stopped = _mlx(["stop", str(launch.pid)], env)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped {launch.pid}" in stopped.stderr
        # The launcher passed SIGTERM on to claude and exits with claude's code.
        assert launch.wait(timeout=PROCESS_EXIT_S) == 40 + signal.SIGTERM
        assert json.loads((tmp_path / "report.json").read_text())["signals"] == [signal.SIGTERM]
        assert "the agent session on it has ended" in " ".join(stopped.stderr.split())
        assert launch.stderr is not None
        said = " ".join(launch.stderr.read().split())  # and the launch says why, on its side
        assert "this launch was stopped (SIGTERM: `mlx stop`" in said, said
        assert f"exit code {40 + signal.SIGTERM}" in said

        # One left: a plain `mlx stop` stops it.
        last = _mlx(["stop"], env)
        assert last.returncode == 0 and f"stopped {serve.pid}" in last.stderr, last.stderr
        assert serve.wait(timeout=PROCESS_EXIT_S) == 0
        assert json.loads(_mlx(["ps", "--json"], env).stdout) == []
        nothing = _mlx(["stop"], env)
        assert nothing.returncode == 1 and "no mlx server is running" in nothing.stderr
    finally:
        for proc in (serve, launch):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.mark.slow
def test_on_a_terminal_stop_asks_which(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    first, second = (subprocess.Popen(sleep) for _ in range(2))
    try:
        write_state(_state(first.pid, "qwen-coder-7b"), home)
        write_state(_state(second.pid, "demo", kind="launch"), home)
        env = {**os.environ, "MLXLAUNCH_HOME": str(home), "COLUMNS": "80"}
        code, stderr = _mlx_on_a_terminal(["stop"], env, f"{second.pid}\n")
        assert code == 0, stderr
        assert str(first.pid) in stderr and "qwen-coder-7b" in stderr  # both were listed
        assert f"stopped {second.pid} (launch, demo)" in stderr
        assert second.wait(timeout=PROCESS_EXIT_S) == -signal.SIGTERM
        assert first.poll() is None  # only the one chosen
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
