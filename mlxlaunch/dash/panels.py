"""What the dashboard's panels say, as pure functions of a snapshot (easy to test, no Textual)."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape

from mlxlaunch.dash.snapshot import RequestRow, StatsSnapshot, human_bytes, human_duration

REQUEST_COLUMNS = (
    "request",
    "kind",
    "model",
    "prompt",
    "cached",
    "output",
    "ttft",
    "tok/s",
    "outcome",
)


def _line(label: str, value: str) -> str:
    return f"[dim]{label:<11}[/dim] [b]{value}[/b]"


def requests_card(s: StatsSnapshot) -> str:
    """Queue, running and how requests ended."""
    return "\n".join(
        [
            _line("queued", str(s.queue_depth)),
            _line("running", str(s.running)),
            _line("completed", str(s.completed)),
            _line("429 busy" if s.overloaded is not None else "refused", str(s.too_busy)),
            _line("cancelled", str(s.cancelled)),
            _line("failed", str(s.failed)),
        ]
    )


def model_card(s: StatsSnapshot) -> str:
    """The model, its load state and memory."""
    return "\n".join(
        [
            _line("model", escape(short_model(s.model))),
            _line("state", s.state),
            _line("memory", human_bytes(s.memory_active_bytes)),
            _line("mlx cache", human_bytes(s.memory_cache_bytes)),
            _line("uptime", human_duration(s.uptime_s)),
        ]
    )


def cache_card(s: StatsSnapshot) -> str:
    """Prefix-cache effectiveness and footprint."""
    return "\n".join(
        [
            _line("hit ratio", f"{s.cache_hit_ratio:.0%}"),
            _line("cached tok", f"{s.cached_tokens:,}"),
            _line("prompt tok", f"{s.prompt_tokens:,}"),
            _line("memory", human_bytes(s.cache_bytes)),
            _line("disk", human_bytes(s.cache_disk_bytes)),
        ]
    )


def rate_title(name: str, current: float, history: list[float]) -> str:
    """`prefill 1,234 tok/s (peak 2,000)` above a sparkline."""
    peak = max(history, default=0.0)
    return f"{name} [b]{current:,.0f}[/b] tok/s  [dim](peak {peak:,.0f})[/dim]"


def short_model(model: str | None, width: int = 20) -> str:
    """The last path part of a model id or directory, cut to `width` (cards are narrow)."""
    if not model:
        return "-"
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return name if len(name) <= width else name[: width - 1] + "…"


def short_id(request_id: str, width: int = 14) -> str:
    """Request ids are long and alike at the start; the end tells them apart."""
    return request_id if len(request_id) <= width else "…" + request_id[-(width - 1) :]


def request_cells(row: RequestRow) -> tuple[str, ...]:
    """A recent request as table cells, in REQUEST_COLUMNS order."""
    return (
        short_id(row.request_id),
        row.kind,
        short_model(row.model),
        f"{row.prompt_tokens:,}",
        f"{row.cached_tokens:,}",
        f"{row.output_tokens:,}",
        f"{row.ttft_s:.2f}s",
        f"{row.decode_tps:.1f}",
        row.outcome,
    )


def miss_text(miss: Any) -> str:
    """The latest cache-miss diagnostic, or a note that there is none."""
    if miss is None or miss == {}:
        return (
            "[dim]No cache miss reported yet.\n\n"
            "When a request could not reuse the cached prefix of an earlier one, the server "
            "explains why here (where the prompts diverged, what was evicted).[/dim]"
        )
    if isinstance(miss, dict):
        width = max((len(str(k)) for k in miss), default=0)
        lines = []
        for key, value in miss.items():
            shown = value if isinstance(value, str) else json.dumps(value)
            lines.append(f"[dim]{escape(str(key)):<{width}}[/dim]  {escape(shown)}")
        return "\n".join(lines)
    return escape(str(miss))
