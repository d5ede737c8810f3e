"""The report of a cluster benchmark: a column per rank count and each one's ratio to the first.

The ratio reads like the peer comparison's speedup: above 1, that many ranks did better than
the first rank count (usually one process) on that row; below 1, worse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from mlxlaunch.bench.report import markdown_heading, markdown_rows, summary_cells
from mlxlaunch.bench.rows import SummaryRow


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
    ratios = [(name, base) for name in others]
    for cells in summary_cells(rows, names, ratios, markup=True):
        table.add_row(*cells)
    return table


def rank_markdown(report: dict[str, Any], rows: list[SummaryRow]) -> str:
    """The summary as a Markdown table, headed like `mlx bench`'s and followed by the notes
    on how to read it (ranks sharing one machine measure overhead, not a speed-up)."""
    names: list[str] = report["ranks"]["names"]
    base, others = names[0], names[1:]
    lines = markdown_heading(report)
    header = ["workload", "metric", *names, *(ratio_column(n, base) for n in others), "limit"]
    ratios = [(name, base) for name in others]
    lines += markdown_rows(header, summary_cells(rows, names, ratios, markup=False))
    notes = report["ranks"].get("notes") or []
    if notes:
        lines += ["", *(f"Note: {note}." for note in notes)]
    return "\n".join(lines) + "\n"
