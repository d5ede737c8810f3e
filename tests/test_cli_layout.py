"""What `mlx` prints at 80 and 200 columns: snapshots, and checks that no column collapsed, no
line is too wide and every value (a fix command above all) shows whole.

Regenerate the snapshots with `MLXLAUNCH_UPDATE_SNAPSHOTS=1` (see tests/text_snapshots.py).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from local_store import write_store
from rich.console import Console
from rich.text import Text
from text_snapshots import assert_fits, assert_snapshot, assert_whole

from mlxlaunch.cli.doctor import print_checks
from mlxlaunch.cli.layout import Column, record_blocks, table_width, wrap_words
from mlxlaunch.cli.main import main
from mlxlaunch.cli.model_views import CATALOG_COLUMNS, LIST_COLUMNS
from mlxlaunch.launch.doctor import Check
from mlxlaunch.store import CATALOG, list_models
from mlxlaunch.store.memory import format_bytes

WIDTHS = (80, 200)
GROUP = "test_cli_layout"

INSTALL = "npm install -g @anthropic-ai/claude-code"
CURL = "curl -fsSL https://claude.ai/install.sh | bash"
# Fixed checks, so the snapshot shows the layout, not this machine (or new checks elsewhere).
CHECKS = [
    Check("MLX backend", "warn", "mlx 0.32.4 on cpu: generation will be slow",
          'on Linux with an NVIDIA GPU: pip install "mlx[cuda]"'),
    Check("memory", "ok", "25.3 GB total; recommended model: qwen3-14b"),
    Check("claude", "fail", "Claude Code is not on PATH",
          f"install Claude Code with `{INSTALL}` (or `{CURL}`), or pass --claude-bin PATH"),
    Check("model odd", "fail", "no tokenizer files (tokenizer.json / tokenizer.model)",
          "mlx models rm odd, then mlx models pull qwen3-14b"),
    Check("disk", "ok", "84.6 GB free at /home/user/.cache/huggingface/hub"),
    Check("server", "info", "none running", "start one: mlx launch claude"),
]  # fmt: skip


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty, private model store; output as a plain (uncoloured) pipe would get it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hub"


def _run(argv: list[str], width: int, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> str:  # fmt: skip
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("width", WIDTHS)
def test_models_list(
    width: int, cli_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_store(cli_env)
    out = _run(["models", "list"], width, monkeypatch, capsys)
    assert_snapshot(GROUP, f"models_list_{width}", out)
    assert_fits(out, width)
    assert_whole(out, [c.header for c in LIST_COLUMNS[1:]])  # the name heads each block
    models = list_models()
    assert len(models) == 3
    for m in models:
        assert_whole(out, [m.name, m.repo_id or "", format_bytes(m.size_on_disk)])
    assert_whole(out, ["qwen3-4b", "4.0B", "40,960", "json_tools", "(incomplete)"])


@pytest.mark.parametrize("width", WIDTHS)
def test_models_catalog(
    width: int, cli_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(["models", "catalog"], width, monkeypatch, capsys)
    assert_snapshot(GROUP, f"models_catalog_{width}", out)
    assert_fits(out, width)
    assert_whole(out, [c.header for c in CATALOG_COLUMNS[2:]])
    for e in CATALOG:
        assert_whole(out, [e.alias, e.repo_id, e.params, format_bytes(e.memory_bytes)])


def _doctor(width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    print_checks(console, CHECKS)
    return console.export_text()


@pytest.mark.parametrize("width", WIDTHS)
def test_doctor_report(width: int) -> None:
    out = _doctor(width)
    assert_snapshot(GROUP, f"doctor_{width}", out)
    assert_fits(out, width)
    # Commands a user copies stay on one line; every other fix and finding shows in full.
    assert_whole(out, [INSTALL, CURL, 'pip install "mlx[cuda]"', "mlx models pull qwen3-14b"])
    words = out.split()
    for check in CHECKS:
        for word in (check.detail + " " + (check.fix or "")).split():
            assert word in words or any(word in w for w in words), word


def test_doctor_is_a_table_when_every_fix_fits_on_one_line() -> None:
    # The longest fix is 148 characters: a table needs 211 columns, blocks do below that.
    wide = _doctor(220)
    assert "┃ fix" in wide
    assert_fits(wide, 220)
    assert_whole(wide, [c.fix or "" for c in CHECKS])
    assert "┃" not in _doctor(200)


@pytest.mark.parametrize("width", WIDTHS)
def test_serve_help(
    width: int, cli_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(["serve", "--help"], width, monkeypatch, capsys)
    assert_snapshot(GROUP, f"serve_help_{width}", out)
    assert_fits(out, width)
    assert_whole(out, ["--max-concurrency", "--memory-fraction", "--allow-origin", "-m, --model"])


def test_wrap_keeps_backticked_commands_whole() -> None:
    text = f"install Claude Code with `{INSTALL}` (or `{CURL}`), or pass --claude-bin PATH"
    for width in (30, 55, 60):
        lines = [line.plain for line in wrap_words(text, width)]
        assert " ".join(lines) == text
        assert any(f"`{INSTALL}`" in line for line in lines)
        assert any(f"`{CURL}`)," in line for line in lines)
        # Only a command longer than the line itself may run past it, alone on its line.
        assert all(len(line) <= width or line in (f"`{INSTALL}`", f"`{CURL}`),") for line in lines)


def test_a_piece_longer_than_the_line_is_never_broken() -> None:
    path = "/very/long/" + "x" * 100
    assert [line.plain for line in wrap_words(f"at {path} now", 40)] == ["at", path, "now"]


def test_table_width_counts_one_line_columns_whole() -> None:
    columns = [Column("name"), Column("note", wrap=True)]
    rows = [["qwen3-coder-30b", "a long note that may wrap at any of its spaces"]]
    # 15 for the name, 20 (the narrowest a wrapping column gets) for the note, 7 for borders.
    assert table_width(columns, rows) == 15 + 20 + 7


def test_blocks_pack_pairs_and_wrap_long_ones_under_their_label() -> None:
    from mlxlaunch.cli.layout import Record

    record = Record(Text("qwen3-4b"), (("size", "2.3 GB"), ("bits", "4"), ("note", "word " * 20)))
    lines = [line.plain for line in record_blocks([record], 40)]
    assert lines[0] == "qwen3-4b"
    assert lines[1] == "  size 2.3 GB  bits 4"
    assert lines[2].startswith("  note word")
    assert all(line.startswith("       word") for line in lines[3:])
    assert all(len(line) <= 40 for line in lines)
