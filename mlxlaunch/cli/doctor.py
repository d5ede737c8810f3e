"""`mlx doctor`: check this machine for running Claude Code on a local model.

The checks themselves live in `mlxlaunch.launch.doctor`; this module only shows them: a table
when the console is wide enough for every fix on one line, else a block per check, or JSON.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlxlaunch.cli.consoles import stdout_console
from mlxlaunch.cli.layout import Column, print_lines, report_table, table_width, wrap_words
from mlxlaunch.cli.options import JsonOption
from mlxlaunch.cluster.hosts import cluster_from_options
from mlxlaunch.cluster.link import LinkFigures, measure_link
from mlxlaunch.cluster.preflight import Preflight, check_cluster
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.doctor import Check, cluster_checks, gather_facts, run_checks, worst

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "info": "blue"}
STATUS_WORD = {"ok": "ok", "warn": "warn", "fail": "FAIL", "info": "info"}
COLUMNS = (Column("check"), Column("status"), Column("found", wrap=True), Column("fix"))
# Block layout: the status word, padded, then the check; detail and fix lines hang under it.
HANG = 6
FIX = "fix: "
TITLE = "mlx doctor"
CLUSTER_TITLE = "mlx doctor: cluster"


def _fix(check: Check) -> str:
    return check.fix if check.status != "ok" and check.fix else ""


def _status(check: Check) -> Text:
    return Text(STATUS_WORD[check.status], style=STATUS_STYLE[check.status])


def _rows(checks: list[Check]) -> list[list[str | Text]]:
    return [[c.name, _status(c), c.detail, Text(_fix(c), style="cyan")] for c in checks]


def checks_table(checks: list[Check], title: str = TITLE) -> Table:
    """The report as a rich table: check, status, what was found, how to fix it."""
    return report_table(COLUMNS, _rows(checks), title=title)


def check_blocks(checks: list[Check], width: int, title: str = TITLE) -> list[Text]:
    """The report as a block per check, each fix kept whole, for consoles too narrow to tabulate.

    `ok   claude: 2.1.332 at /usr/bin/claude`, and under a check that is not ok, `fix: …`.
    """
    lines = [Text(title, style="bold")]
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


def print_checks(console: Console, checks: list[Check], title: str = TITLE) -> None:
    """The report in the layout that fits `console`: a table, or blocks when it would not fit."""
    if table_width(COLUMNS, _rows(checks)) <= console.width:
        console.print(checks_table(checks, title))
    else:
        print_lines(console, check_blocks(checks, console.width, title))


def _checks_list(checks: list[Check]) -> list[dict[str, Any]]:
    return [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks]


def checks_json(checks: list[Check]) -> dict[str, Any]:
    """The report as one JSON document: the overall verdict and every check."""
    return {"status": worst(checks), "checks": _checks_list(checks)}


def cluster_json(
    checks: list[Check], preflight: Preflight, link: LinkFigures | None
) -> dict[str, Any]:
    """The cluster section as JSON: its checks, each host's facts, the plan and the link."""
    return {
        "status": worst(checks),
        "checks": _checks_list(checks),
        "hosts": [dataclasses.asdict(h) for h in preflight.hosts],
        "plan": preflight.plan.as_json() if preflight.plan else None,
        "problems": list(preflight.problems),
        "link": dataclasses.asdict(link) if link else None,
    }


def cluster_report(
    hosts: str | None, hostfile: Path | None, model: str | None, backend: str | None,
    parallel: str,
) -> tuple[list[Check], Preflight, LinkFigures | None]:  # fmt: skip
    """Probe the cluster the options name, measure its link when every host answers."""
    cluster = cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel)
    assert cluster is not None  # the caller checked that hosts or a hostfile were given
    from mlxlaunch.engine.engine import probe_shards  # mlx-lm's answer: MLX loads only here

    preflight = check_cluster(cluster, model, probe_shards=probe_shards)
    broken = preflight.of_kind("unreachable", "broken", "versions", "backend")
    link = None if broken else measure_link(cluster)
    return cluster_checks(preflight, link), preflight, link


def doctor(
    claude_bin: Annotated[
        str | None, typer.Option(help="The claude executable to check (default: on PATH).")
    ] = None,
    hosts: Annotated[
        str | None,
        typer.Option(help="Also check a cluster: its hosts (IPs or ssh names), comma-separated."),
    ] = None,
    hostfile: Annotated[
        Path | None, typer.Option(help="Also check the cluster of an MLX JSON hostfile.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="With --hosts: the model to look for on every host and to plan."),
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="With --hosts: ring (default) or jaccl.")
    ] = None,
    parallel: Annotated[str, typer.Option(help="With --hosts: auto, tensor or pipeline.")] = "auto",
    as_json: JsonOption = False,
) -> None:
    """Check MLX, memory, Claude Code, models, disk and running servers; suggest fixes.

    With --hosts or --hostfile, also check a cluster: each host reachable over ssh, the same
    mlx, mlx-lm and mlxlaunch everywhere, the backend, the model on every host and its shards
    against each host's memory, and the measured link latency and bandwidth.

    Exits 1 when a check fails, 0 otherwise (warnings included).

    Examples:

      mlx doctor

      mlx doctor --claude-bin ~/.local/bin/claude

      mlx doctor --hosts 10.0.0.1,10.0.0.2 --model qwen3-coder-30b

      mlx doctor --json | jq '.checks[] | select(.status != "ok")'
    """
    if model is not None and hosts is None and hostfile is None:
        raise ConfigError("--model needs --hosts or --hostfile (it names the model to check)")
    checks = run_checks(gather_facts(claude_bin=claude_bin))
    cluster: tuple[list[Check], Preflight, LinkFigures | None] | None = None
    if hosts is not None or hostfile is not None:
        cluster = cluster_report(hosts, hostfile, model, backend, parallel)
    if as_json:
        report = checks_json(checks)
        if cluster is not None:
            report["cluster"] = cluster_json(*cluster)
        typer.echo(json.dumps(report, indent=2))
    else:
        console = stdout_console()
        print_checks(console, checks)
        if cluster is not None:
            print_checks(console, cluster[0], CLUSTER_TITLE)
    failed = worst(checks) == "fail" or (cluster is not None and worst(cluster[0]) == "fail")
    if failed:
        raise typer.Exit(1)
