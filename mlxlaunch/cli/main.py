"""The `mlx` command: one Typer root app, one module per command group.

Typed errors (mlxlaunch.errors.MlxLaunchError) are turned into one-line messages and distinct
exit codes here, at the edge; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys

import typer
from rich.console import Console

# Command groups: each module registers its commands on the shared root `app` (cli/app.py)
# when imported. Add one import per group here (sub-apps: `app.add_typer(...)` below).
from mlxlaunch.cli import bench as _bench  # noqa: F401
from mlxlaunch.cli import completions as _completions  # noqa: F401
from mlxlaunch.cli import config as _config  # noqa: F401
from mlxlaunch.cli import dash as _dash  # noqa: F401
from mlxlaunch.cli import doctor as _doctor  # noqa: F401
from mlxlaunch.cli import launch as _launch  # noqa: F401
from mlxlaunch.cli import models
from mlxlaunch.cli import serve as _serve  # noqa: F401
from mlxlaunch.cli.app import app
from mlxlaunch.errors import MlxLaunchError

app.add_typer(models.app, name="models")

_err = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turning typed errors into messages."""
    debug = os.environ.get("MLX_DEBUG") == "1" or "--debug" in (argv or sys.argv[1:])
    try:
        # Without standalone mode click *returns* a typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
    except MlxLaunchError as exc:
        if debug:
            raise
        _err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.hint:
            _err.print(f"[dim]hint:[/] {exc.hint}", highlight=False)
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
        _err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}", highlight=False)
        _err.print("[dim]run again with --debug for the traceback[/]")
        return 70
    return result if isinstance(result, int) else 0


def entry() -> None:
    """setuptools console script."""
    code = main()
    # Exit without interpreter teardown: once MLX has run on a worker thread, its C++ statics can
    # abort the process while Python finalises ("terminate called…", exit 134), which would
    # replace the real exit code (claude's, for `mlx launch`). Everything is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
