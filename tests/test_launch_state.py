"""State files that let `mlx dash`, `mlx doctor` and the store find a running server."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from run_records import run_record

from mlxlaunch.launch import state


def _state(pid: int, started_at: float = 1.0) -> state.RunState:
    return run_record(pid, started_at=started_at)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_written_file_has_the_shared_format_and_private_modes(tmp_path: Path) -> None:
    path = state.write_state(_state(os.getpid()), tmp_path)
    assert path == tmp_path / "run" / f"{os.getpid()}.json"
    data = json.loads(path.read_text())
    assert data == {
        "pid": os.getpid(),
        "url": "http://127.0.0.1:1234",
        "token": "tok",
        "model": "demo",
        "model_path": "/m",
        "started_at": 1.0,
        "log_file": "/l.log",
        "kind": "launch",
        "client": None,
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_home_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "h"))
    assert state.run_dir() == tmp_path / "h" / "run"


def test_live_servers_are_listed_newest_first(tmp_path: Path) -> None:
    # Our own pid and our parent's are both alive.
    state.write_state(_state(os.getpid(), started_at=1.0), tmp_path)
    state.write_state(_state(os.getppid(), started_at=2.0), tmp_path)
    assert [s.pid for s in state.running_servers(tmp_path)] == [os.getppid(), os.getpid()]


@pytest.mark.quick
def test_stale_and_malformed_files_are_detected_and_pruned(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale_path = state.write_state(_state(dead), tmp_path)
    bad = tmp_path / "run" / "999999.json"
    bad.write_text("{not json")
    assert state.is_stale(_state(dead))
    assert state.running_servers(tmp_path, prune=False) == []
    assert stale_path.exists()
    assert state.running_servers(tmp_path) == []
    assert not stale_path.exists() and not bad.exists()


def test_remove_is_idempotent(tmp_path: Path) -> None:
    state.write_state(_state(os.getpid()), tmp_path)
    state.remove_state(os.getpid(), tmp_path)
    state.remove_state(os.getpid(), tmp_path)
    assert state.running_servers(tmp_path) == []


def test_from_json_rejects_wrong_kind() -> None:
    data = json.loads(json.dumps(_state(1).__dict__))
    data["kind"] = "other"
    with pytest.raises(ValueError):
        state.RunState.from_json(data)


def test_the_store_reads_what_launch_writes_without_the_token(tmp_path: Path) -> None:
    from mlxlaunch.store.running import running_servers, servers_using

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    written = dataclasses.replace(_state(os.getpid()), model_path=str(model_dir))
    state.write_state(written, tmp_path)
    [server] = running_servers(tmp_path)
    assert (server.pid, server.url, server.model) == (written.pid, written.url, written.model)
    assert server.model_path == model_dir
    assert "token" not in vars(server)
    assert servers_using(tmp_path, tmp_path) == [server]  # inside the removed folder
    assert servers_using(tmp_path / "other", tmp_path) == []


@pytest.mark.quick
def test_launch_and_the_store_agree_on_what_runs(tmp_path: Path) -> None:
    """One answer to "what is running": a record only a partial reader accepts still counts
    for the store (it must not delete that model), is skipped by strict readers, and a stale
    record is gone for both."""
    from mlxlaunch.store.running import running_servers

    state.write_state(_state(os.getpid(), started_at=2.0), tmp_path)
    older = tmp_path / "run" / f"{os.getppid()}.json"
    older.write_text(json.dumps({"pid": os.getppid(), "started_at": 1.0}))
    state.write_state(_state(_dead_pid()), tmp_path)
    assert [s.pid for s in running_servers(tmp_path)] == [os.getpid(), os.getppid()]
    assert [s.pid for s in state.running_servers(tmp_path, prune=False)] == [os.getpid()]
    assert [s.pid for s in state.running_servers(tmp_path, prune=False, partial=True)] == [
        os.getpid(),
        os.getppid(),
    ]


def test_partial_reading_needs_only_the_pid() -> None:
    older = {"pid": 7, "url": "http://127.0.0.1:1", "model_path": None}
    with pytest.raises(ValueError, match=r"log_file|token|kind"):
        state.RunState.from_json(older)
    parsed = state.RunState.from_json(older, partial=True)
    assert (parsed.pid, parsed.url, parsed.model_path, parsed.token) == (7, older["url"], "", "")
    with pytest.raises(ValueError, match="pid"):
        state.RunState.from_json({"url": "x"}, partial=True)
    with pytest.raises(ValueError):
        state.RunState.from_json([1, 2], partial=True)  # type: ignore[arg-type]


def test_a_malformed_record_is_refused_naming_its_field() -> None:
    data = json.loads(json.dumps(dataclasses.asdict(_state(1))))
    data["client"] = {"model_id": "m", "small_model_id": "s", "context_window": "4096"}
    with pytest.raises(ValueError, match=r"'client\.max_output_tokens': Field required"):
        state.RunState.from_json(data)
    data["client"] = None
    data["pid"] = "one"
    with pytest.raises(ValueError, match=r"'pid': .*integer"):
        state.RunState.from_json(data)
    data["pid"] = "7"  # what pydantic converts, it reads
    assert state.RunState.from_json(data).pid == 7
