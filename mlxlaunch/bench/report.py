"""The report: a rich table for the terminal and one JSON document with every raw figure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from mlxlaunch.bench.rows import SLOW_ROUND_RATIO, SummaryRow
from mlxlaunch.bench.stats import spread
from mlxlaunch.bench.summary import format_rate

SCHEMA = "mlxlaunch.bench/1"


def format_value(value: float | None, unit: str) -> str:
    """A figure for the table: seconds below one as milliseconds, rates without decimals."""
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "%":
        return f"{value:.2%}"
    return f"{format_rate(value)} tok/s"


def format_speedup(value: float | None) -> str:
    """`1.25×` in green when ours is better by 5% or more, red when worse by as much."""
    if value is None:
        return "—"
    style = "green" if value >= 1.05 else "red" if value <= 0.95 else ""
    text = f"{value:.2f}×"
    return f"[{style}]{text}[/]" if style else text


def ratio_cell(row: SummaryRow, ours: str, base: str, *, markup: bool = True) -> str:
    """The ratio of `ours` to `base` on `row`; for a row run in rounds, the range of the
    per-round ratios and the rounds below SLOW_ROUND_RATIO, marked (their ratios are in
    `slow_round_notes`); plain text for Markdown."""
    ratio = row.speedup(ours, base)
    if ratio is None:
        return "—" if markup else ""
    text = format_speedup(ratio) if markup else f"{ratio:.2f}×"
    ratios = row.round_speedups(ours, base)
    low_high = spread(ratios)
    if len(ratios) > 1 and low_high:
        span = f"({low_high['min']:.2f}–{low_high['max']:.2f})"
        text += f" [dim]{span}[/]" if markup else f" {span}"
    slow = row.slow_rounds(ours, base)
    if slow:
        numbers = ", ".join(str(number) for number, _ in slow)
        mark = f"round{'s' if len(slow) > 1 else ''} {numbers} < {SLOW_ROUND_RATIO}×"
        text += f" [bold red]{mark}[/]" if markup else f"; {mark}"
    return text


# Said under a table with rows run in rounds.
ROUNDS_CAPTION = "concurrency: median of the rounds, ratio (min–max) of the rounds"


def render_table(rows: list[SummaryRow], ours: str, peer: str | None, title: str) -> Table:
    """The summary table: a column per server, their ratio, and the in-process limit.

    speedup > 1: ours is better. limit: the in-process prefill floor or decode ceiling.
    """
    caption = "limit: in-process prefill floor / decode ceiling"
    if peer:
        caption = "speedup > 1: ours better · " + caption
        if any(row.rounds for row in rows):
            caption += " · " + ROUNDS_CAPTION
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("workload", style="bold")
    table.add_column("metric")
    table.add_column(ours, justify="right")
    if peer:
        table.add_column(peer, justify="right")
        table.add_column("speedup", justify="right")
    table.add_column("limit", justify="right", style="dim")
    names = [ours, peer] if peer else [ours]
    for cells in summary_cells(rows, names, [(ours, peer)] if peer else [], markup=True):
        table.add_row(*cells)
    return table


def summary_cells(
    rows: list[SummaryRow],
    names: Sequence[str],
    ratios: Sequence[tuple[str, str]],
    *,
    markup: bool,
) -> Iterator[list[str]]:
    """The cells of each summary row: workload (only where it changes), metric, a figure per
    server in `names` (with its note), a ratio per `(ours, base)` in `ratios`, the limit;
    rich markup for the terminal, plain text for Markdown."""
    value = format_value if markup else plain_value
    previous = ""
    for row in rows:
        cells = [row.workload if row.workload != previous else "", row.metric]
        for name in names:
            cell = value(row.values.get(name), row.unit) if row.values else ""
            note = row.notes.get(name)
            if markup:
                cells.append(f"{cell} [dim]({note})[/]" if note else cell)
            else:
                cells.append(f"{cell} ({note})" if note and cell else cell)
        for ours, base in ratios:
            cells.append(ratio_cell(row, ours, base, markup=markup) if row.values else "")
        cells.append(value(row.limit, row.unit) if row.limit is not None else "")
        yield cells
        previous = row.workload


def markdown_rows(header: Sequence[str], cell_rows: Iterable[list[str]]) -> list[str]:
    """A Markdown table's lines: the header, its rule, a line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in cell_rows]
    return lines


def build_report(
    *,
    config: dict[str, Any],
    machine: dict[str, Any],
    model: dict[str, Any],
    targets: dict[str, dict[str, Any]],
    servers: dict[str, Any],
    limits: dict[str, Any],
    rows: list[SummaryRow],
    ours: str,
    peer: str | None,
    started: datetime | None = None,
    elapsed_s: float | None = None,
) -> dict[str, Any]:
    """The JSON document: run description, every raw figure, and the summary rows."""
    return {
        "schema": SCHEMA,
        "date": (started or datetime.now(UTC)).isoformat(timespec="seconds"),
        "elapsed_s": elapsed_s,
        "config": config,
        "machine": machine,
        "model": model,
        "targets": targets,
        "ours": ours,
        "peer": peer,
        "workloads": {
            "agent_session": servers["agent_session"],
            "new_session": servers["new_session"],
            "restart": servers.get("restart", {}),
            "tool_loop": servers.get("tool_loop", {}),
            "haiku_tier": servers.get("haiku_tier", {}),
            "codex_session": servers.get("codex_session", {}),
            "replay": servers.get("replay", {}),
            "concurrency": servers["concurrency"],
            "decode": {"runs": servers["decode"], "ceiling": limits["decode_ceiling"]},
            "prefill_floor": limits["prefill_floor"],
            "warmup": servers["warmup"],
        },
        "summary": [r.as_dict(ours, peer or "") for r in rows],
    }


# Said under the header of a CPU run, so nobody reads "below the floor" as a measuring error.
LIMITS_ON_CPU = (
    "Limits are measured in-process with mlx-lm's own model code. On the CPU backend "
    "mlxlaunch's engine runs its own attention (`mlxlaunch/engine/runtime/cpu_attention.py`, "
    "NumPy's vectorised exponential on MLX's buffers), so its prefills and decode steps can beat "
    "them."
)


# Said under a quick run's table: its figures are not the ones the README quotes.
QUICK_RUN = (
    "quick run: a short prompt and few turns, where fixed per-request costs (HTTP, rendering, "
    "scheduling) outweigh the prefill the prefix cache saves; compare full runs "
    "(`mlx bench --model medium`) before drawing conclusions."
)


def caveats(rows: list[SummaryRow], ours: str, peer: str | None, *, quick: bool) -> list[str]:
    """What a reader must know before trusting the table: a quick run, and each row where the
    peer did better in this run (said, not hidden)."""
    notes = [QUICK_RUN] if quick else []
    if peer:
        slower = [
            f"{row.workload} {row.metric} ({ratio:.2f}×)"
            for row in rows
            if row.values and (ratio := row.speedup(ours, peer)) is not None and ratio < 0.95
        ]
        if slower:
            notes.append(f"{peer} was faster in this run on: " + "; ".join(slower))
        notes += slow_round_notes(rows, ours, peer)
    return notes


def slow_round_notes(rows: list[SummaryRow], ours: str, base: str) -> list[str]:
    """One note naming every round of every row below SLOW_ROUND_RATIO (none: no note)."""
    slow = [
        f"{row.workload} round {number} ({ratio:.2f}×)"
        for row in rows
        for number, ratio in row.slow_rounds(ours, base)
    ]
    if not slow:
        return []
    return [
        f"rounds below {SLOW_ROUND_RATIO}× {base} (a stall shows here, not in the median): "
        + "; ".join(slow)
    ]


def markdown_heading(report: dict[str, Any]) -> list[str]:
    """The lines above a Markdown table: date, model, BLAS, machine (and, on a CPU, why the
    limits can be beaten)."""
    machine, model = report["machine"], report["model"]
    memory = machine.get("memory_bytes")
    lines = [
        f"**{report['date'][:10]}** · model `{model['name']}` · BLAS: {machine['blas']} · "
        f"{machine['device']} ({machine['machine']}, {machine['cpu_count']} CPUs"
        + (f", {memory / 1024**3:.0f} GiB" if memory else "")
        + f") · mlx {machine['mlx']}, mlx-lm {machine['mlx_lm']}",
        "",
    ]
    if "cpu" in str(machine.get("device", "")).lower():
        lines += [LIMITS_ON_CPU, ""]
    return lines


def plain_value(value: float | None, unit: str) -> str:
    """A figure for Markdown (no rich markup; an en dash where there is none)."""
    return format_value(value, unit).replace("—", "–")


def markdown_table(report: dict[str, Any], rows: list[SummaryRow]) -> str:
    """The summary as a Markdown table (for a README), headed by date, model, BLAS, machine.

    Columns: each server, their ratio (>1: ours better) and the in-process limit (prefill
    floor or decode ceiling). Per-server notes (cache hits, floor ratios) follow the figures.
    """
    ours, peer = report["ours"], report.get("peer")
    lines = markdown_heading(report)
    names = [ours, peer] if peer else [ours]
    header = ["workload", "metric", *names] + (["ratio"] if peer else []) + ["limit"]
    ratios = [(ours, peer)] if peer else []
    lines += markdown_rows(header, summary_cells(rows, names, ratios, markup=False))
    return "\n".join(lines) + "\n"


def write_json(report: dict[str, Any], path: Path) -> Path:
    """Write the report to `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return path
