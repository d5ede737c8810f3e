"""`mlx doctor`: check this machine for running Claude Code on a local model.

The checks themselves live in `mlxlaunch.launch.doctor`; this module only shows them: a table
when the console is wide enough for every fix on one line, else a block per check, or JSON.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlxlaunch.cli.layout import Column, print_lines, report_table, table_width, wrap_words
from mlxlaunch.cli.options import JsonOption
from mlxlaunch.launch.doctor import Check, gather_facts, run_checks, worst

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "info": "blue"}
STATUS_WORD = {"ok": "ok", "warn": "warn", "fail": "FAIL", "info": "info"}
COLUMNS = (Column("check"), Column("status"), Column("found", wrap=True), Column("fix"))
# Block layout: the status word, padded, then the check; detail and fix lines hang under it.
HANG = 6
FIX = "fix: "


def _fix(check: Check) -> str:
    return check.fix if check.status != "ok" and check.fix else ""


def _status(check: Check) -> Text:
    return Text(STATUS_WORD[check.status], style=STATUS_STYLE[check.status])


def _rows(checks: list[Check]) -> list[list[str | Text]]:
    return [[c.name, _status(c), c.detail, Text(_fix(c), style="cyan")] for c in checks]


def checks_table(checks: list[Check]) -> Table:
    """The report as a rich table: check, status, what was found, how to fix it."""
    return report_table(COLUMNS, _rows(checks), title="mlx doctor")


def check_blocks(checks: list[Check], width: int) -> list[Text]:
    """The report as a block per check, each fix kept whole, for consoles too narrow to tabulate.

    `ok   claude: 2.1.332 at /usr/bin/claude`, and under a check that is not ok, `fix: …`.
    """
    lines = [Text("mlx doctor", style="bold")]
    room = max(width - HANG, 1)
    for check in checks:
        head = Text(f"{check.name}: ", style="bold")
        head.append(check.detail)
        first, *rest = wrap_words(head, room)
        lines.append(_status(check).append(" " * (HANG - len(STATUS_WORD[check.status]))) + first)
        lines += [Text(" " * HANG) + line for line in rest]
        if fix := _fix(check):
            first, *rest = wrap_words(Text(fix, style="cyan"), room - len(FIX), clauses=True)
            lines.append(Text(" " * HANG) + Text(FIX, style="dim") + first)
            lines += [Text(" " * (HANG + len(FIX))) + line for line in rest]
    return lines


def print_checks(console: Console, checks: list[Check]) -> None:
    """The report in the layout that fits `console`: a table, or blocks when it would not fit."""
    if table_width(COLUMNS, _rows(checks)) <= console.width:
        console.print(checks_table(checks))
    else:
        print_lines(console, check_blocks(checks, console.width))


def checks_json(checks: list[Check]) -> dict[str, Any]:
    """The report as one JSON document: the overall verdict and every check."""
    return {
        "status": worst(checks),
        "checks": [
            {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks
        ],
    }


def doctor(
    claude_bin: Annotated[
        str | None, typer.Option(help="The claude executable to check (default: on PATH).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check MLX, memory, Claude Code, models, disk and running servers; suggest fixes.

    Exits 1 when a check fails, 0 otherwise (warnings included).

    Examples:

      mlx doctor

      mlx doctor --claude-bin ~/.local/bin/claude

      mlx doctor --json | jq '.checks[] | select(.status != "ok")'
    """
    checks = run_checks(gather_facts(claude_bin=claude_bin))
    if as_json:
        typer.echo(json.dumps(checks_json(checks), indent=2))
    else:
        print_checks(Console(), checks)
    if worst(checks) == "fail":
        raise typer.Exit(1)
