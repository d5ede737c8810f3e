"""The `mlx` command: one Typer root app, and the table of every command registered on it.

Typed errors (mlxlaunch.errors.MlxLaunchError) are turned into one-line messages and distinct
exit codes here, at the edge; `--debug` (before or after the command) shows the traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from mlxlaunch.blas import use_optimised_blas
from mlxlaunch.cli import bench, completions, config, dash, doctor, launch, models, ps, serve
from mlxlaunch.cli.app import Overrides, app
from mlxlaunch.errors import MlxLaunchError

# Every command and group of `mlx`, registered here and nowhere else (as huggingface_hub's
# `hf.py` does); `mlx --help` lists the commands in this order, then the groups. A new command
# adds one line. `short_help` is its line in that list, short enough to show whole at 80 columns.
app.add_typer(
    launch.launch_app,
    name="launch",
    short_help="Start an agent (Claude Code, Codex, opencode) on a local model.",
)
app.command("serve", help=serve.SERVE_HELP, short_help="Serve a model (Anthropic Messages API).")(
    serve.serve
)
app.command("ps", help=ps.PS_HELP, short_help="List the mlx servers running here.")(ps.ps)
app.command("stop", help=ps.STOP_HELP, short_help="Stop a running mlx server.")(ps.stop)
app.add_typer(models.models_app, name="models")
app.command("doctor", short_help="Check this machine and suggest fixes.")(doctor.doctor)
app.command("dash", help=dash.DASH_HELP, short_help="Watch a running server live.")(dash.dash)
app.command("bench", short_help="Measure time to first token and decode speed.")(bench.bench)
app.add_typer(config.config_app, name="config")
app.command("completions", short_help="Print shell completion scripts.")(completions.completions)

DEBUG_FLAG = "--debug"

_err = Console(stderr=True)


def take_debug_flag(args: list[str]) -> tuple[bool, list[str]]:
    """Whether `--debug` is among `args` before any `--`, and `args` with it moved first.

    `--debug` is an option of the root command; moving it lets `mlx serve --model demo --debug`
    mean `mlx --debug serve --model demo`. After `--` the words belong to another program.
    """
    end = args.index("--") if "--" in args else len(args)
    found = DEBUG_FLAG in args[:end]
    if not found:
        return False, list(args)
    rest = [a for a in args[:end] if a != DEBUG_FLAG] + args[end:]
    return True, [DEBUG_FLAG, *rest]


def main(argv: list[str] | None = None, *, overrides: Overrides | None = None) -> int:
    """Console-script entry point: run the app, turning typed errors into messages.

    `overrides` replace defaults of the serving commands (tests only; see cli/app.py).
    """
    flagged, args = take_debug_flag(sys.argv[1:] if argv is None else argv)
    debug = flagged or os.environ.get("MLX_DEBUG") == "1"
    try:
        # Without standalone mode click *returns* a typer.Exit's code instead of raising it.
        result = app(
            args=args, prog_name="mlx", standalone_mode=False, obj=overrides or Overrides()
        )
    except MlxLaunchError as exc:
        if debug:
            raise
        # Messages carry what users, files and other hosts wrote: shown as text, not markup.
        _err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
        if exc.hint:
            _err.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        _err.print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # click usage errors and anything unexpected
        # Typer vendors click, so usage errors are recognised by shape, not by class.
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        if debug:
            raise
        _err.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}",
            highlight=False,
        )
        _err.print("[dim]run again with --debug for the traceback[/]")
        return 70
    return result if isinstance(result, int) else 0


def entry() -> None:
    """setuptools console script."""
    # First, before any command imports mlx: libmlx binds its matmul to the first BLAS loaded.
    blas = use_optimised_blas()
    if blas.outcome == "failed":
        _err.print(
            f"[yellow]warning:[/] BLAS {blas.path} not loaded ({blas.error}); "
            "MLX uses its reference BLAS",
            highlight=False,
        )
    code = main()
    # Exit without interpreter teardown: once MLX has run on a worker thread, its C++ statics can
    # abort the process while Python finalises ("terminate called…", exit 134), which would
    # replace the real exit code (claude's, for `mlx launch`). Everything is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
