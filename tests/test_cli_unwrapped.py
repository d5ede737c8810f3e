"""Output to a non-terminal (a log, a pipe, CI) is not hard-wrapped: a path or a command stays
on one line, whole, as it does on a wide terminal. `COLUMNS` still sets the width."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxlaunch.cli.consoles import UNWRAPPED_WIDTH, CliConsole, stdout_console
from mlxlaunch.cli.main import main

DEEP = "a-rather-long-folder-name-that-goes-on/" * 4


@pytest.fixture
def no_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private store, and output as a pipe gets it: no COLUMNS, no forced terminal."""
    for name in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path


def test_an_error_naming_a_long_path_keeps_it_on_one_line(
    no_terminal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = no_terminal / DEEP / "not-a-model"
    folder.mkdir(parents=True)
    assert main(["models", "add", str(folder)]) == 3
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("error:"))
    assert str(folder) in line and len(line) > 80, err


def test_a_table_takes_the_width_it_needs(
    no_terminal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = no_terminal / DEEP / "my-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    (model / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (model / "tokenizer.json").write_text("{}")
    name = "a-model-registered-under-a-name-longer-than-a-narrow-column-would-hold"
    assert main(["models", "add", str(model), "--name", name]) == 0
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert any(name in line and "┃" not in line for line in out.splitlines()), out
    assert max(len(line) for line in out.splitlines()) > 80


def test_columns_still_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    console = stdout_console()
    assert console.width == 80 and not console.soft_wrap


def test_on_a_terminal_the_terminal_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert CliConsole(force_terminal=True, width=100).width == 100
    unwrapped = stdout_console()
    assert unwrapped.width == UNWRAPPED_WIDTH and unwrapped.soft_wrap
    assert CliConsole(soft_wrap=True, force_terminal=True).soft_wrap  # asked for, kept
