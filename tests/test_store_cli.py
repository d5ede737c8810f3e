"""`mlx models …` end to end through the CLI edge, against the fake hub."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehub import FakeHub, serve_test_repos

from mlxlaunch.cli.main import main
from mlxlaunch.store import catalog_entry, list_models

ALIAS = "qwen3-4b"  # the fake hub serves the tiny model under this alias's repo id


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    with FakeHub() as server:
        serve_test_repos(server, tiny_model_dir)
        entry = catalog_entry(ALIAS)
        assert entry is not None
        server.add_repo_from_dir(entry.repo_id, tiny_model_dir)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.mark.slow
def test_pull_list_info_rm_by_alias(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "pull", ALIAS]) == 0
    err = capsys.readouterr().err
    assert "mlx-community/Qwen3-4B-4bit" in err and "memory:" in err and "ready:" in err

    assert main(["models", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["alias"] == ALIAS and row["complete"] and row["tool_format"] == "json_tools"

    assert main(["models", "list"]) == 0
    table = capsys.readouterr().out
    assert ALIAS in table and "json_tools" in table and "40,960" in table

    assert main(["models", "info", ALIAS, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "model.safetensors" in info["files"] and "tools" in info["template_features"]

    assert main(["models", "rm", ALIAS, "--yes"]) == 0
    assert "freed" in capsys.readouterr().err
    assert list_models() == []


@pytest.mark.slow
def test_rm_without_yes_asks_first(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["models", "pull", ALIAS]) == 0
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    assert main(["models", "rm", ALIAS]) != 0
    assert len(list_models()) == 1


@pytest.mark.slow
def test_refusal_and_not_found_are_one_line_errors(
    hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", "test-org/unknown-arch"]) == 4
    err = capsys.readouterr().err
    assert "frobnicator" in err and "--force" in err and "Traceback" not in err
    assert main(["models", "pull", "test-org/missing"]) == 3
    assert "no model 'test-org/missing' on the hub" in capsys.readouterr().err
    assert main(["models", "info", "nothing-here"]) == 3


def test_offline_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", "pull", ALIAS]) == 5
    err = capsys.readouterr().err
    assert "cannot reach the hub" in err and "Traceback" not in err


def test_recommend_for_a_given_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "recommend", "--memory", "32", "--compute", "metal"]) == 0
    assert capsys.readouterr().out.split("\t")[0] == "qwen3-coder-30b"
    assert main(["models", "recommend", "--memory", "0.5"]) == 2


@pytest.mark.slow
def test_add_registers_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", "add", str(tiny_model_dir), "--name", "tiny-local"]) == 0
    assert [m.name for m in list_models()] == ["tiny-local"]
    assert main(["models", "add", str(tmp_path)]) == 3
