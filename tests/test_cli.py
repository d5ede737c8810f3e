"""CLI conventions: version, help, typed errors at the edge, completion scripts kept fresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from mlxlaunch import __version__
from mlxlaunch.cli.app import app
from mlxlaunch.cli.completions import render_all
from mlxlaunch.cli.main import main
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
    expected = render_all()[name]
    on_disk = (ROOT / "completions" / name).read_text()
    assert on_disk == expected, (
        f"completions/{name} is stale: run `mlx completions --write completions`"
    )


def test_completion_scripts_cover_every_command() -> None:
    import mlxlaunch.cli.main  # noqa: F401

    command = typer.main.get_command(app)
    bash = render_all()["mlx.bash"]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            assert name in bash


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


def test_cli_start_does_not_import_mlx() -> None:
    """Every `mlx` command starts quickly: only the commands that serve or bench load mlx."""
    code = "import sys, mlxlaunch.cli.main; print('mlx' in sys.modules, 'mlx_lm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["False", "False"], proc.stderr
