"""The small things of a first hour: each agent's help speaks of its own flags, Codex's
--print-config gives a CODEX_HOME that exists, `mlx models list` shows the demo, `mlx dash`
without a terminal prints one snapshot, and `mlx bench` leaves the working tree alone."""

from __future__ import annotations

import http.server
import inspect
import re
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ps_stop import _state

from mlxlaunch.cli import bench as bench_cli
from mlxlaunch.cli.main import main
from mlxlaunch.launch.state import write_state
from mlxlaunch.protocol.stats import ModelStatus, StatsSnapshot


def _out(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> tuple[str, str]:
    assert main(argv) == code
    captured = capsys.readouterr()
    return captured.out, " ".join(captured.err.split())


@pytest.mark.parametrize("agent", ["codex", "opencode"])
def test_an_agents_help_names_its_own_flags_and_not_claude_codes(
    agent: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    help_text, _ = _out(["launch", agent, "--help"], capsys)
    assert "--print-config" in help_text and "--print-env" not in help_text
    assert "Claude Code" not in help_text and "--safeguards" not in help_text
    claude, _ = _out(["launch", "claude", "--help"], capsys)
    assert "--print-env" in claude and "--safeguards" in claude  # Claude Code's own, kept


def test_codex_print_config_writes_the_codex_home_it_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    argv = ["launch", "codex", "--print-config", "--url", "http://127.0.0.1:9", "--token", "t"]
    out, _ = _out([*argv, "--context-length", "65536"], capsys)
    assert "<launch dir" not in out
    exported = re.search(r"^export CODEX_HOME=(.+)$", out, re.M)
    assert exported is not None, out
    home = Path(shlex.split(exported.group(1))[0])
    config = (home / "config.toml").read_text()
    assert "model_context_window = 65536" in config and config in out  # what it printed


def test_models_list_names_the_demo_and_the_test_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    _, err = _out(["models", "list"], capsys)
    assert "Offline, nothing to download: demo" in err and "mlx launch claude --model demo" in err
    assert "tiny" in err
    out, _ = _out(["models", "list", "--json"], capsys)
    assert out.strip() == "[]"  # the JSON lists what is on disk, as before


@pytest.fixture
def stats_server() -> Iterator[str]:
    """A local server answering GET /v1/stats with a snapshot, as an mlx server does."""
    body = StatsSnapshot(model=ModelStatus(name="qwen-coder-7b", state="loaded"), running=2)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.model_dump_json().encode()
            self.send_response(200 if self.path == "/v1/stats" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_dash_without_a_terminal_prints_one_snapshot_and_exits(
    stats_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _out(["dash", "--url", stats_server, "--token", "t"], capsys)
    assert "\x1b" not in out  # no escape codes
    assert f"mlx dash {stats_server}" in out and "qwen-coder-7b" in out and "loaded" in out
    assert re.search(r"running\s+2", out), out


def test_dash_without_a_terminal_and_no_server_says_so_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    _, err = _out(["dash"], capsys, code=1)
    assert "no running server found" in err and "mlx serve" in err
    write_state(_state(999_999_999, "gone"), tmp_path / "home")  # a record of a dead server
    _, err = _out(["dash"], capsys, code=1)
    assert "no running server found" in err


def test_bench_writes_under_the_mlxlaunch_home_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    assert bench_cli.bench_dir() == tmp_path / "home" / "bench"
    # No default under the current directory: --out unset means bench_dir().
    assert inspect.signature(bench_cli.bench).parameters["out"].default is None
