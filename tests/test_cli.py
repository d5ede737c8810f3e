"""CLI conventions: version, help, typed errors at the edge, completion scripts kept fresh."""

from __future__ import annotations

import json
import logging
import os
import pkgutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

import mlxlaunch.cli
from mlxlaunch import __version__
from mlxlaunch.cli.app import app
from mlxlaunch.cli.command_tree import command_tree, subcommands
from mlxlaunch.cli.commands import root_command
from mlxlaunch.cli.completions import render_all
from mlxlaunch.cli.main import main, take_debug_flag
from mlxlaunch.errors import ModelNotFound

ROOT = Path(__file__).resolve().parent.parent


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_help_lists_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Examples" in out
    assert "mlx launch claude" in out


@pytest.mark.slow
def test_console_script_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlxlaunch", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert __version__ in proc.stdout


def test_typed_error_becomes_one_line_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    @app.command("_raise-for-test", hidden=True)
    def _raise() -> None:
        raise ModelNotFound("no model called 'nope'", hint="mlx models pull nope")

    try:
        code = main(["_raise-for-test"])
    finally:
        app.registered_commands = [
            c for c in app.registered_commands if c.name != "_raise-for-test"
        ]
    err = capsys.readouterr().err
    assert code == ModelNotFound.exit_code
    assert "no model called 'nope'" in err
    assert "mlx models pull nope" in err
    assert "Traceback" not in err


def test_debug_shows_traceback() -> None:
    @app.command("_boom-for-test", hidden=True)
    def _boom() -> None:
        raise ModelNotFound("boom")

    try:
        with pytest.raises(ModelNotFound):
            main(["--debug", "_boom-for-test"])
    finally:
        app.registered_commands = [c for c in app.registered_commands if c.name != "_boom-for-test"]


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mlx.bash", "_mlx", "mlx.fish"])
def test_completion_scripts_are_fresh(name: str) -> None:
    """Regenerate with `mlx completions --write completions` when this fails."""
    expected = render_all(command_tree(root_command()))[name]
    on_disk = (ROOT / "completions" / name).read_text()
    assert on_disk == expected, (
        f"completions/{name} is stale: run `mlx completions --write completions`"
    )


def test_completion_scripts_cover_every_command() -> None:
    import mlxlaunch.cli.main  # noqa: F401

    command = typer.main.get_command(app)
    bash = render_all(command_tree(root_command()))["mlx.bash"]
    names = [name for name, sub in subcommands(command).items() if not sub.hidden]
    assert {"serve", "launch", "models", "dash", "bench"} <= set(names)
    for name in names:
        assert name in bash


@pytest.mark.quick
def test_bash_completion_completes_top_level() -> None:
    script = ROOT / "completions" / "mlx.bash"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"source {script}; COMP_WORDS=(mlx --ver); COMP_CWORD=1; _mlx; "
            'echo "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "--version"


@pytest.mark.slow
def test_cli_start_does_not_import_mlx() -> None:
    """Every `mlx` command starts quickly: only the commands that serve or bench load mlx."""
    code = "import sys, mlxlaunch.cli.main; print('mlx' in sys.modules, 'mlx_lm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["False", "False"], proc.stderr


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`--debug` configures the root logger; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def test_debug_after_the_command_shows_the_traceback(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    @app.command("_crash-for-test", hidden=True)
    def _crash() -> None:
        raise RuntimeError("internal")

    try:
        assert main(["_crash-for-test"]) == 70
        assert "run again with --debug" in capsys.readouterr().err
        with pytest.raises(RuntimeError, match="internal"):
            main(["_crash-for-test", "--debug"])
    finally:
        app.registered_commands = [
            c for c in app.registered_commands if c.name != "_crash-for-test"
        ]


def test_debug_is_accepted_after_any_subcommand(restore_logging: None) -> None:
    # Unknown options are refused even next to --help, so exit 0 means --debug parsed.
    assert main(["serve", "--model", "demo", "--debug", "--help"]) == 0
    assert main(["models", "list", "--debug", "--help"]) == 0
    assert main(["launch", "claude", "--debug", "--help"]) == 0


def test_debug_flag_moves_first_but_not_from_another_programs_words() -> None:
    assert take_debug_flag(["serve", "--model", "demo", "--debug"]) == (
        True,
        ["--debug", "serve", "--model", "demo"],
    )
    claude_words = ["launch", "claude", "--", "-p", "hi", "--debug"]
    assert take_debug_flag(claude_words) == (False, claude_words)


@pytest.mark.slow
def test_models_list_with_debug_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "MLXLAUNCH_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "mlxlaunch", "models", "list", "--json", "--debug"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


@pytest.mark.slow
def test_commands_are_registered_only_in_main() -> None:
    """Importing a command module registers nothing; cli/main.py's table does it all."""
    modules = sorted(
        m.name for m in pkgutil.iter_modules(mlxlaunch.cli.__path__) if m.name != "main"
    )
    code = (
        "import importlib, mlxlaunch.cli.app as a\n"
        f"for m in {modules!r}: importlib.import_module('mlxlaunch.cli.' + m)\n"
        "print(len(a.app.registered_commands), len(a.app.registered_groups))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["0", "0"], proc.stderr


@pytest.mark.quick
def test_ctrl_c_while_the_cli_loads_ends_quietly() -> None:
    # Importing the CLI takes about a second, so a signal just after the entry point starts
    # lands in it; an interrupt then is exit 130 with no traceback, like one later on. The
    # child says when it reaches the entry point: on a busy machine the interpreter's own
    # start-up (before Python handles SIGINT at all) can take longer than any fixed delay.
    code = (
        "import sys; sys.argv = ['mlx', '--version']; print('ready', flush=True); "
        "from mlxlaunch.console import run; run()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (130, 0), err  # 0: it had finished before the signal came
