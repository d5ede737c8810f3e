"""What the dashboard's panels say, as pure functions of a snapshot (easy to test, no Textual)."""

from __future__ import annotations

from rich.markup import escape

from mlxlaunch.dash.snapshot import human_bytes, human_duration
from mlxlaunch.protocol.stats import AgentSession, CacheMiss, RecentRequest, StatsSnapshot

SESSION_COLUMNS = ("session", "turns", "reused", "last prompt", "last TTFT", "latest miss")

REQUEST_COLUMNS = (
    "request",
    "kind",
    "model",
    "prompt",
    "cached",
    "output",
    "ttft",
    "tok/s",
    "draft",
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
            _line("completed", str(s.counters.requests_completed)),
            _line("429 busy", str(s.counters.requests_overloaded)),
            _line("cancelled", str(s.counters.requests_cancelled)),
            _line("failed", str(s.counters.requests_failed)),
        ]
    )


def model_card(s: StatsSnapshot) -> str:
    """The model, its load state and memory; then each model served beside it, with its own
    state, queue and rates (the figures above are the main model's)."""
    return "\n".join(
        [
            _line("model", escape(short_model(s.model.name))),
            _line("state", s.model.state),
            _line("memory", human_bytes(s.memory.active_bytes)),
            _line("mlx cache", human_bytes(s.memory.cache_bytes)),
            _line(f"kv {s.memory.kv_bits}-bit", human_bytes(s.memory.kv_cache_bytes)),
            _line("uptime", human_duration(s.uptime_s)),
            *(_beside(m) for m in s.models[1:]),
        ]
    )


def _beside(m: StatsSnapshot) -> str:
    """One line for a model served beside the main one, e.g. `haiku  qwen3-4b loaded 1+0
    84 tok/s` (running+queued, decode speed), or why it is not served."""
    role = "haiku" if m.role == "small" else m.role
    name = escape(short_model(m.model.name, width=16))
    if m.failure:
        return _line(role, f"{name} [red]failed[/red]")
    return _line(
        role, f"{name} {m.model.state} {m.running}+{m.queue_depth} {m.decode_tps:,.0f} tok/s"
    )


def cache_card(s: StatsSnapshot) -> str:
    """Prefix-cache effectiveness and footprint."""
    return "\n".join(
        [
            _line("hit ratio", f"{s.cache.hit_ratio:.0%}"),
            _line("cached tok", f"{s.counters.cached_tokens:,}"),
            _line(
                "drafts",
                draft_cell(s.counters.accepted_tokens, s.counters.drafted_tokens) + " accepted",
            ),
            _line("prompt tok", f"{s.counters.prompt_tokens:,}"),
            _line("memory", human_bytes(s.cache.bytes)),
            _line("disk", human_bytes(s.cache.disk_bytes)),
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


def request_cells(row: RecentRequest) -> tuple[str, ...]:
    """A recent request as table cells, in REQUEST_COLUMNS order."""
    return (
        short_id(row.request_id),
        row.kind,
        short_model(row.model_alias),
        f"{row.prompt_tokens:,}",
        f"{row.cached_tokens:,}",
        f"{row.output_tokens:,}",
        f"{row.ttft_s:.2f}s",
        f"{row.decode_tps:.1f}",
        draft_cell(row.accepted_tokens, row.drafted_tokens),
        row.outcome,
    )


def session_cells(session: AgentSession, last_miss: CacheMiss | None) -> tuple[str, ...]:
    """An agent session as table cells, in SESSION_COLUMNS order; its latest miss explained
    where the server's latest miss (`last_miss`) is that one."""
    reused = session.cached_tokens / session.prompt_tokens if session.prompt_tokens else 0.0
    return (
        escape(short_id(session.key, 16)),
        str(session.turns),
        f"{reused:.0%}",
        f"{session.last_cached_tokens:,}/{session.last_prompt_tokens:,}",
        f"{session.last_ttft_s:.2f}s",
        session_miss(session, last_miss),
    )


def session_miss(session: AgentSession, last_miss: CacheMiss | None) -> str:
    """What a session's latest miss lost: its turn, what it reused, and where the prompt
    diverged when the server's latest miss is this one."""
    if not session.miss_turn:
        return "none"
    text = (
        f"turn {session.miss_turn}: {session.miss_cached_tokens:,} of "
        f"{session.miss_prompt_tokens:,} reused ({escape(session.miss_reuse)})"
    )
    if last_miss is not None and last_miss.request_id == session.miss_request_id:
        text += f", diverged at token {last_miss.position:,}"
    return text


def draft_cell(accepted: int, drafted: int) -> str:
    """Speculative decoding's share of accepted drafts, `-` where nothing was drafted."""
    return f"{accepted / drafted:.0%}" if drafted else "-"


def miss_text(miss: CacheMiss | None) -> str:
    """The latest cache-miss diagnostic, or a note that there is none."""
    if miss is None:
        return (
            "[dim]No cache miss reported yet.\n\n"
            "When a request could not reuse the cached prefix of an earlier one, the server "
            "explains why here (where the prompts diverged, what was reused).[/dim]"
        )
    lines = [
        _line("request", f"{escape(short_id(miss.request_id))} ({escape(miss.kind)})"),
        _line("diverged", f"at token {miss.position:,} of {miss.request_tokens:,}"),
        _line("nearest", f"an earlier prompt of {miss.nearest_tokens:,} tokens"),
        _line("reused", f"{miss.cached_tokens:,} tokens"),
        "",
    ]
    digests = miss.digests
    hashed = bool(digests.before or digests.cached or digests.request)  # older servers: none
    if hashed:
        lines.append(
            _line(
                "digests",
                f"before #{escape(digests.before)}  earlier #{escape(digests.cached)}  "
                f"this one #{escape(digests.request)}",
            )
        )
    if miss.excerpts is None:
        note = (
            "The server does not share prompt text (other clients' words; a server started "
            "with --debug-cache does)."
        )
        if hashed:
            note += " Equal digests mean equal text: the same digests every turn are one change"
            note += " repeated (a timestamp)."
        lines += ["", f"[dim]{note}[/dim]"]
    else:
        lines += [
            _line("before", escape(repr(miss.excerpts.before))),
            _line("earlier", escape(repr(miss.excerpts.cached))),
            _line("this one", escape(repr(miss.excerpts.request))),
        ]
    return "\n".join(lines)


def snapshot_text(s: StatsSnapshot, url: str) -> str:
    """The whole dashboard as one block of text, for `mlx dash` without a terminal (markup)."""
    cards = (("requests", requests_card(s)), ("model", model_card(s)), ("cache", cache_card(s)))
    lines = [f"[b]mlx dash[/b] {escape(url)}"]
    for title, card in cards:
        lines += ["", f"[b]{title}[/b]", card]
    lines += ["", rate_title("prefill", s.prefill_tps, []), rate_title("decode", s.decode_tps, [])]
    return "\n".join(lines)
