"""`mlx doctor`: check this machine for running Claude Code on a local model."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mlxlaunch.cli.app import app
from mlxlaunch.launch.doctor import Check, gather_facts, run_checks, worst

STATUS_STYLE = {
    "ok": "[green]ok[/]",
    "warn": "[yellow]warn[/]",
    "fail": "[red]FAIL[/]",
    "info": "[blue]info[/]",
}


def checks_table(checks: list[Check]) -> Table:
    """The report as a rich table: check, status, what was found, how to fix it."""
    table = Table(title="mlx doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("found")
    table.add_column("fix", style="cyan")
    for check in checks:
        fix = check.fix if check.status != "ok" and check.fix else ""
        # Details hold things like `mlx[cuda]` that rich would read as markup.
        table.add_row(check.name, STATUS_STYLE[check.status], escape(check.detail), escape(fix))
    return table


@app.command("doctor")
def doctor(
    claude_bin: Annotated[
        str | None, typer.Option(help="The claude executable to check (default: on PATH).")
    ] = None,
) -> None:
    """Check MLX, memory, Claude Code, models, disk and running servers; suggest fixes.

    Exits 1 when a check fails, 0 otherwise (warnings included).
    """
    checks = run_checks(gather_facts(claude_bin=claude_bin))
    Console().print(checks_table(checks))
    if worst(checks) == "fail":
        raise typer.Exit(1)
