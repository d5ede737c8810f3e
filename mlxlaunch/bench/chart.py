"""A small SVG line chart of per-turn time to first token, written without plotting libraries."""

from __future__ import annotations

import math
from html import escape
from typing import Any

WIDTH, HEIGHT = 720, 420
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 180, 50, 50
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
FLOOR_COLOR = "#7f7f7f"


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above `value` (a tidy top for the y axis)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def turn_series(servers: dict[str, Any], limits: dict[str, Any]) -> dict[str, list[float | None]]:
    """Per-turn TTFT of each server, plus the in-process prefill floor, keyed by series name."""
    turns = servers["agent_session"]
    series: dict[str, list[float | None]] = {
        name: [t["results"][name]["ttft_s"] for t in turns] for name in servers["targets"]
    }
    floors = {f["label"]: f["seconds"] for f in limits.get("prefill_floor", [])}
    if floors:
        series["prefill floor (in-process)"] = [floors.get(f"turn {t['turn']}") for t in turns]
    return series


def line_chart_svg(series: dict[str, list[float | None]], *, title: str, y_label: str) -> str:
    """An SVG line chart: x is the 1-based index in each series, y the value (missing: gap)."""
    points = max((len(v) for v in series.values()), default=0)
    top = _nice_ceiling(max((y for v in series.values() for y in v if y is not None), default=1))
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x_at(i: int) -> float:
        return MARGIN_LEFT + (plot_w * i / (points - 1) if points > 1 else plot_w / 2)

    def y_at(v: float) -> float:
        return MARGIN_TOP + plot_h * (1 - v / top)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{MARGIN_LEFT}" y="28" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for tick in range(5):  # horizontal grid and y labels
        value = top * tick / 4
        y = y_at(value)
        out.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{MARGIN_LEFT + plot_w}" y2="{y:.1f}" '
            'stroke="#e0e0e0"/>'
        )
        out.append(
            f'<text x="{MARGIN_LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{value:g}</text>'
        )
    for i in range(points):  # x labels: turn numbers
        out.append(
            f'<text x="{x_at(i):.1f}" y="{MARGIN_TOP + plot_h + 18}" text-anchor="middle">'
            f"{i + 1}</text>"
        )
    out.append(
        f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">turn</text>'
    )
    out.append(
        f'<text transform="translate(18 {MARGIN_TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    out.append(
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#888"/>'
    )
    for index, (name, values) in enumerate(series.items()):
        floor = name.startswith("prefill floor")
        color = FLOOR_COLOR if floor else COLORS[index % len(COLORS)]
        dash = ' stroke-dasharray="6 4"' if floor else ""
        segments: list[list[str]] = [[]]
        for i, v in enumerate(values):
            if v is None:
                segments.append([])
            else:
                segments[-1].append(f"{x_at(i):.1f},{y_at(v):.1f}")
        for segment in segments:
            if segment:
                out.append(
                    f'<polyline points="{" ".join(segment)}" fill="none" stroke="{color}" '
                    f'stroke-width="2"{dash}/>'
                )
        for i, v in enumerate(values):
            if v is not None:
                out.append(f'<circle cx="{x_at(i):.1f}" cy="{y_at(v):.1f}" r="3" fill="{color}"/>')
        legend_y = MARGIN_TOP + 10 + 20 * index
        legend_x = MARGIN_LEFT + plot_w + 15
        out.append(
            f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def turn_ttft_svg(servers: dict[str, Any], limits: dict[str, Any], *, model: str) -> str:
    """The per-turn TTFT chart of the agent session, for every server and the floor."""
    return line_chart_svg(
        turn_series(servers, limits),
        title=f"Agent session: time to first token per turn ({model})",
        y_label="seconds",
    )
