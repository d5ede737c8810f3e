"""The report of a cluster benchmark: a column per rank count and each one's ratio to the first.

The ratio reads like the peer comparison's speedup: above 1, that many ranks did better than
the first rank count (usually one process) on that row; below 1, worse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from mlxlaunch.bench.report import format_value, markdown_heading, plain_value, ratio_cell
from mlxlaunch.bench.summary import SummaryRow


def ratio_column(name: str, base: str) -> str:
    """The header of a ratio column: "2 ranks / 1 rank"."""
    return f"{name} / {base}"


def render_rank_table(rows: list[SummaryRow], names: Sequence[str], title: str) -> Table:
    """The summary table: a column per rank count, the ratio of each to the first, the limit."""
    base, others = names[0], list(names[1:])
    caption = f"ratio > 1: more ranks better than {base} · limit: in-process (one process)"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("workload", style="bold")
    table.add_column("metric")
    for name in names:
        table.add_column(name, justify="right")
    for name in others:
        table.add_column(ratio_column(name, base), justify="right")
    table.add_column("limit", justify="right", style="dim")
    previous = ""
    for row in rows:
        cells = [row.workload if row.workload != previous else "", row.metric]
        for name in names:
            cell = format_value(row.values.get(name), row.unit) if row.values else ""
            note = row.notes.get(name)
            cells.append(f"{cell} [dim]({note})[/]" if note else cell)
        for name in others:
            cells.append(ratio_cell(row, name, base) if row.values else "")
        cells.append(format_value(row.limit, row.unit) if row.limit is not None else "")
        table.add_row(*cells)
        previous = row.workload
    return table


def rank_markdown(report: dict[str, Any], rows: list[SummaryRow]) -> str:
    """The summary as a Markdown table, headed like `mlx bench`'s and followed by the notes
    on how to read it (ranks sharing one machine measure overhead, not a speed-up)."""
    names: list[str] = report["ranks"]["names"]
    base, others = names[0], names[1:]
    lines = markdown_heading(report)
    header = ["workload", "metric", *names, *(ratio_column(n, base) for n in others), "limit"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    previous = ""
    for row in rows:
        cells = [row.workload if row.workload != previous else "", row.metric]
        for name in names:
            cell = plain_value(row.values.get(name), row.unit) if row.values else ""
            note = row.notes.get(name)
            cells.append(f"{cell} ({note})" if note and cell else cell)
        for name in others:
            cells.append(ratio_cell(row, name, base, markup=False) if row.values else "")
        cells.append(plain_value(row.limit, row.unit) if row.limit is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
        previous = row.workload
    notes = report["ranks"].get("notes") or []
    if notes:
        lines += ["", *(f"Note: {note}." for note in notes)]
    return "\n".join(lines) + "\n"
