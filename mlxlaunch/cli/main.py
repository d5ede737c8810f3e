"""The `mlx` command: the root app with every command on it (cli/commands.py), run here.

Typed errors (mlxlaunch.errors.MlxLaunchError) are turned into one-line messages and distinct
exit codes here, at the edge; `--debug` (before or after the command) shows the traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer
from rich.markup import escape

from mlxlaunch.blas import use_optimised_blas
from mlxlaunch.cli.app import Overrides
from mlxlaunch.cli.commands import app
from mlxlaunch.cli.consoles import stderr_console
from mlxlaunch.errors import MlxLaunchError

DEBUG_FLAG = "--debug"

_err = stderr_console()


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


def explain_usage_error(exc: Exception) -> None:
    """Add what to do to click's message where it says only what went wrong.

    An option that a command does not know, given to a command that hands the words after
    `--` to another program (`mlx launch claude -p …`), was most likely meant for that
    program: say where its arguments go.
    """
    option, ctx = getattr(exc, "option_name", None), getattr(exc, "ctx", None)
    message = getattr(exc, "message", None)
    if not isinstance(option, str) or ctx is None or not isinstance(message, str):
        return
    passes_on = [p for p in ctx.command.params if p.param_type_name == "argument" and p.nargs == -1]
    if not passes_on:
        return
    program = ctx.info_name or "it"
    exc.message = (  # type: ignore[attr-defined]
        f"{message}. Options for {program} itself go after `--`: "
        f"{ctx.command_path} [OPTIONS] -- {option} …"
    )


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
        # The table imports the errors of every room: read only when one reaches the edge,
        # so `mlx --help` imports no room it does not use.
        from mlxlaunch.cli.error_text import error_text

        message, hint = error_text(exc)
        _err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        if hint:
            _err.print(f"[dim]hint:[/] {escape(hint)}", highlight=False)
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
            explain_usage_error(exc)
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
