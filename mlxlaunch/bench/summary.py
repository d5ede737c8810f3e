"""From raw figures to the rows of the report: one row per workload and metric, per server."""

from __future__ import annotations

import itertools
from typing import Any

from mlxlaunch.bench.haiku_tier import WORKLOAD as HAIKU_TIER
from mlxlaunch.bench.haiku_tier import haiku_tier_rows
from mlxlaunch.bench.rows import SummaryRow
from mlxlaunch.bench.rows import percentile_of as _p
from mlxlaunch.bench.stats import intervals, percentile, spread, summarize, throughput
from mlxlaunch.bench.workloads import TURN_KINDS


def _cache_note(timing: dict[str, Any]) -> str:
    if timing.get("error"):
        return "error: " + str(timing["error"])[:60]
    prompt, cached = timing.get("prompt_tokens"), timing.get("cached_tokens")
    if prompt is None:
        return ""
    if cached is None:
        return f"{_k(prompt)} prompt, reuse not reported"
    return f"{_k(cached)}/{_k(prompt)} cached"


def _reuse_note(timings: list[dict[str, Any]]) -> str:
    """Prompt tokens reused over several turns: "2.1k/6.0k cached over 5 turns"."""
    if len(timings) == 1:
        return _cache_note(timings[0])
    failed = [t for t in timings if t.get("error")]
    if failed:
        return _cache_note(failed[0])
    prompt = sum(t.get("prompt_tokens") or 0 for t in timings)
    if any(t.get("cached_tokens") is None for t in timings):
        return f"{_k(prompt)} prompt over {len(timings)} turns, reuse not reported"
    cached = sum(t["cached_tokens"] for t in timings)
    return f"{_k(cached)}/{_k(prompt)} cached over {len(timings)} turns"


def _k(tokens: int) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else str(tokens)


def _floor(limits: dict[str, Any], label: str) -> float | None:
    for sample in limits.get("prefill_floor", []):
        if sample["label"] == label:
            return float(sample["seconds"])
    return None


def _session_rows(servers: dict[str, Any], limits: dict[str, Any]) -> list[SummaryRow]:
    names: list[str] = servers["targets"]
    cold = servers["new_session"]["cold"]
    rows = [
        SummaryRow(
            "new-session", "cold TTFT", "s", False,
            {n: cold[n]["ttft_s"] for n in names}, _floor(limits, "cold"),
            {n: _cache_note(cold[n]) for n in names},
        )
    ]  # fmt: skip
    warm = servers["new_session"]["warm"]
    warm_floors = [_floor(limits, f"warm {i}") for i in range(1, len(warm) + 1)]
    rows.append(
        SummaryRow(
            "new-session", "warm TTFT p50", "s", False,
            {n: _p((w[n]["ttft_s"] for w in warm), 50) for n in names}, _p(warm_floors, 50),
            {n: _cache_note(warm[-1][n]) for n in names},
        )
    )  # fmt: skip
    for turn in servers["agent_session"]:
        results = turn["results"]
        rows.append(
            SummaryRow(
                "agent-session", f"turn {turn['turn']} TTFT", "s", False,
                {n: results[n]["ttft_s"] for n in names}, _floor(limits, f"turn {turn['turn']}"),
                {n: _cache_note(results[n]) for n in names},
            )
        )  # fmt: skip
    later = servers["agent_session"][1:]
    if later:
        rows.append(
            SummaryRow(
                "agent-session", f"turns 2–{len(later) + 1} TTFT p50", "s", False,
                {n: _p((t["results"][n]["ttft_s"] for t in later), 50) for n in names},
                _p((_floor(limits, f"turn {t['turn']}") for t in later), 50),
            )
        )  # fmt: skip
    return rows


def _reuse(timings: list[dict[str, Any]]) -> float | None:
    """The least share of the previous turn's prompt any turn read from the cache (None when
    the server did not report cached tokens or a turn failed)."""
    shares = []
    for before, after in itertools.pairwise(timings):
        prompt, cached = before.get("prompt_tokens"), after.get("cached_tokens")
        if after.get("error") or not prompt or cached is None:
            return None
        shares.append(cached / prompt)
    return min(shares) if shares else None


def _agent_reuse_row(servers: dict[str, Any]) -> list[SummaryRow]:
    """The Claude Code session's reuse of the previous prompt, beside the Codex session's."""
    names: list[str] = servers["targets"]
    turns = servers["agent_session"]
    if len(turns) < 2:
        return []
    per_server = {n: [t["results"][n] for t in turns] for n in names}
    return [
        SummaryRow(
            "agent-session", REUSE_METRIC, "%", True,
            {n: _reuse(per_server[n]) for n in names},
            notes={n: "cached tokens not reported" for n in names
                   if _reuse(per_server[n]) is None},
        )
    ]  # fmt: skip


# The metric both sessions report their prefix reuse under: the least share of a turn's
# prompt that the next turn read from the cache.
REUSE_METRIC = "reuse of previous prompt, min"
# Said of a server that answered the Codex session's first request with "no such endpoint".
NO_RESPONSES_API = "no Responses API"


def codex_session_rows(servers: dict[str, Any]) -> list[SummaryRow]:
    """The Codex session per turn: TTFT with its prompt, cached tokens and reuse of the
    previous turn's prompt; the p50 of the later turns; the least reuse. A server without a
    Responses API gets no figure: the first row's note says what it answered, the rest say
    it has none (so no ratio is made up for it)."""
    codex = servers.get("codex_session")
    if not codex:
        return []
    names: list[str] = codex["targets"]
    unsupported: dict[str, str] = codex.get("unsupported", {})
    without = {name: NO_RESPONSES_API for name in unsupported}
    turns = codex["turns"]

    def figure(results: dict[str, Any], name: str, key: str) -> float | None:
        value = results.get(name, {}).get(key)
        return None if value is None else float(value)

    rows = []
    for turn in turns:
        results = turn["results"]
        notes = dict(unsupported if turn["turn"] == 1 else without)
        for name in results:
            note = _cache_note(results[name])
            if results[name].get("reuse") is not None:
                note += f", {results[name]['reuse']:.2%} of turn {turn['turn'] - 1}"
            notes[name] = note
        rows.append(
            SummaryRow(
                "codex-session", f"turn {turn['turn']} TTFT", "s", False,
                {n: figure(results, n, "ttft_s") for n in names}, notes=notes,
            )
        )  # fmt: skip
    later = turns[1:]
    if later:
        rows.append(
            SummaryRow(
                "codex-session", f"turns 2–{len(turns)} TTFT p50", "s", False,
                {n: _p((figure(t["results"], n, "ttft_s") for t in later), 50) for n in names},
                notes=dict(without),
            )
        )  # fmt: skip
        reuse: dict[str, float | None] = {}
        notes = dict(without)
        for name in names:
            sent = [t["results"].get(name, {"error": "not sent"}) for t in turns]
            reuse[name] = None if name in unsupported else _reuse(sent)
            if reuse[name] is None and name not in unsupported:
                notes[name] = "cached tokens not reported"
        rows.append(
            SummaryRow("codex-session", REUSE_METRIC, "%", True, reuse, notes=notes)
        )  # fmt: skip
    return rows


def _miss_note(miss: dict[str, Any] | None) -> str:
    """Where and how a replayed turn left the nearest earlier prompt (our server's account)."""
    if not miss:
        return ""
    return (
        f", missed at token {_k(miss['position'])} of {_k(miss['request_tokens'])} "
        f"(nearest earlier prompt: {_k(miss['nearest_tokens'])})"
    )


def _calls_note(figures: dict[str, Any]) -> str:
    calls = figures.get("calls") or []
    if not calls:
        return ""
    bad = [c["problem"] for c in calls if c.get("problem")]
    return f", {len(calls) - len(bad)}/{len(calls)} calls valid" + (f" ({bad[0]})" if bad else "")


def replay_rows(servers: dict[str, Any]) -> list[SummaryRow]:
    """The replayed session per turn: TTFT with its prompt, cached tokens, where it missed
    the cache and why, and its calls' validity; then the p50 of the turns, the share of all
    prompt tokens reused, the share of valid calls, and decode speed."""
    replay = servers.get("replay")
    if not replay or not replay.get("turns"):
        return []
    names: list[str] = replay["targets"]
    turns = replay["turns"]
    label = f"replay ({replay.get('agent', '?')} {replay.get('version') or ''})".replace(" )", ")")
    rows = []
    for turn in turns:
        results = turn["results"]
        turn_notes = {
            n: _cache_note(r) + _miss_note(r.get("miss")) + _calls_note(r)
            for n, r in results.items()
        }
        rows.append(
            SummaryRow(
                label, f"turn {turn['turn']} TTFT", "s", False,
                {n: results.get(n, {}).get("ttft_s") for n in names}, notes=turn_notes,
            )
        )  # fmt: skip

    def every(name: str) -> list[dict[str, Any]]:
        return [t["results"][name] for t in turns if name in t["results"]]

    reused: dict[str, float | None] = {}
    valid: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for name in names:
        sent = every(name)
        prompt = sum(t.get("prompt_tokens") or 0 for t in sent)
        known = all(t.get("cached_tokens") is not None for t in sent)
        cached = sum(t.get("cached_tokens") or 0 for t in sent)
        reused[name] = cached / prompt if prompt and known else None
        calls = [c for t in sent for c in t.get("calls") or []]
        valid[name] = sum(1 for c in calls if not c.get("problem")) / len(calls) if calls else None
        notes[name] = f"{len(calls)} calls" if calls else "no calls made"
    rows += [
        SummaryRow(
            label, "TTFT p50", "s", False,
            {n: _p((t.get("ttft_s") for t in every(n)), 50) for n in names},
        ),
        SummaryRow(label, "prompt tokens reused", "%", True, reused,
                   notes={n: _reuse_note(every(n)) for n in names}),
        SummaryRow(label, "tool calls valid", "%", True, valid, notes=notes),
        SummaryRow(
            label, "decode p50", "tok/s", True,
            {n: _p((t.get("decode_tokens_per_s") for t in every(n)), 50) for n in names},
        ),
    ]  # fmt: skip
    for setting in replay.get("settings", []):
        [name] = setting["targets"]
        sent = [t["results"][name] for t in setting["turns"]]
        prompt = sum(t.get("prompt_tokens") or 0 for t in sent)
        cached = sum(t.get("cached_tokens") or 0 for t in sent)
        rows.append(
            SummaryRow(
                label, f"TTFT p50, {setting['setting']}", "s", False,
                {name: _p((t.get("ttft_s") for t in sent), 50)},
                notes={name: _reuse_note(sent)},
            )
        )  # fmt: skip
        rows.append(
            SummaryRow(label, f"prompt tokens reused, {setting['setting']}", "%", True,
                       {name: cached / prompt if prompt else None})
        )  # fmt: skip
    return rows


def _tool_loop_rows(servers: dict[str, Any]) -> list[SummaryRow]:
    """A row per kind of turn of the tool loop (the new prompts are what it is for)."""
    loop = servers.get("tool_loop")
    if not loop:
        return []
    names: list[str] = loop["targets"]
    rows = []
    for kind in TURN_KINDS:
        turns = [t["results"] for t in loop["turns"] if t["kind"] == kind]
        if not turns:
            continue
        metric = f"{kind} TTFT" if len(turns) == 1 else f"{kind} TTFT p50"
        rows.append(
            SummaryRow(
                "tool-loop", metric, "s", False,
                {n: _p((t[n]["ttft_s"] for t in turns), 50) for n in names},
                notes={n: _reuse_note([t[n] for t in turns]) for n in names},
            )
        )  # fmt: skip
    return rows


def _decode_rows(servers: dict[str, Any], limits: dict[str, Any]) -> list[SummaryRow]:
    names: list[str] = servers["targets"]
    runs = servers["decode"]
    ceiling = limits.get("decode_ceiling", [])
    rows = [
        SummaryRow(
            "decode", "tokens/s end to end p50", "tok/s", True,
            {n: _p((r[n]["tokens_per_s"] for r in runs), 50) for n in names},
            _p((c["tokens_per_s"] for c in ceiling), 50),
            {n: f"{runs[-1][n].get('output_tokens')} tokens" for n in names},
        )
    ]  # fmt: skip
    itl = {n: [i for r in runs for i in intervals(r[n]["token_times_s"])] for n in names}
    ceiling_itl = [i for c in ceiling for i in intervals(c["token_times_s"])]
    for p in (50, 90, 99):
        rows.append(
            SummaryRow(
                "decode", f"inter-token p{p}", "ms", False,
                {n: _ms(_p(itl[n], p)) for n in names}, _ms(_p(ceiling_itl, p)), compare=False,
            )
        )  # fmt: skip
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def concurrency_figures(run: dict[str, Any]) -> dict[str, Any]:
    """Aggregate and per-stream figures of one K-stream run on one server.

    Aggregate tokens/s is every stream's output over the wall time of them all (what the
    machine delivers); per-stream is each stream's output over its own request time. Both count
    whole requests, so a server that sends tokens in bursts cannot look faster than it is.
    """
    streams = run["streams"]
    output = sum(s.get("output_tokens") or len(s["token_times_s"]) for s in streams)
    per_stream = [
        rate
        for s in streams
        if (rate := throughput(s.get("output_tokens") or len(s["token_times_s"]), s["total_s"]))
    ]
    ttfts = [s["ttft_s"] for s in streams if s["ttft_s"] is not None]
    return {
        "aggregate_tokens_per_s": throughput(output, run["wall_s"]),
        "per_stream_tokens_per_s": summarize(per_stream),
        "ttft_s": summarize(ttfts),
        "errors": sum(1 for s in streams if s.get("error")),
    }


def level_rounds(level: dict[str, Any]) -> list[dict[str, Any]]:
    """A concurrency level's rounds (a report from before rounds has its one run only)."""
    return level.get("rounds") or [{"round": 1, "results": level["results"]}]


def _pooled(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """One server's streams of every round as one run, with the median round's wall time."""
    runs = [r["results"][name] for r in rounds]
    return {
        "wall_s": percentile([run["wall_s"] for run in runs], 50),
        "streams": [stream for run in runs for stream in run["streams"]],
    }


def _rounds_note(figures: list[float | None]) -> str:
    """ "median of 3 rounds, 180–210" (nothing for a single round)."""
    numbers = spread(figures)
    if len(figures) < 2 or not numbers:
        return ""
    low, high = (format_rate(numbers[k]) for k in ("min", "max"))
    return f"median of {len(figures)} rounds, {low}–{high}"


def format_rate(value: float) -> str:
    """A rate without a unit: whole numbers from 100 up, one decimal below."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _concurrency_rows(servers: dict[str, Any]) -> list[SummaryRow]:
    names: list[str] = servers["targets"]
    rows = []
    for level in servers["concurrency"]:
        k = level["streams"]
        rounds = level_rounds(level)
        pooled = {n: _pooled(rounds, n) for n in names}
        figures = {n: concurrency_figures(pooled[n]) for n in names}
        per_round = {
            n: [concurrency_figures(r["results"][n])["aggregate_tokens_per_s"] for r in rounds]
            for n in names
        }
        notes = {n: _rounds_note(per_round[n]) for n in names}
        for n, f in figures.items():
            if f["errors"]:
                notes[n] = ", ".join(filter(None, [f"{f['errors']} failed", notes[n]]))
        label = f"concurrency {k}"
        sizes = {n: _stream_sizes(rounds[0]["results"][n]) for n in names}
        rows += [
            SummaryRow(
                label, "wall time, all streams", "s", False,
                {n: pooled[n]["wall_s"] for n in names}, notes=sizes,
            ),
            SummaryRow(
                label, "aggregate tokens/s", "tok/s", True,
                {n: spread(per_round[n]).get("median") for n in names},
                notes={n: note for n, note in notes.items() if note}, rounds=per_round,
            ),
            SummaryRow(
                label, "per-stream tokens/s p50", "tok/s", True,
                {n: figures[n]["per_stream_tokens_per_s"].get("p50") for n in names},
            ),
            SummaryRow(
                label, "TTFT p50", "s", False, {n: figures[n]["ttft_s"].get("p50") for n in names}
            ),
            SummaryRow(
                label, "TTFT p90", "s", False, {n: figures[n]["ttft_s"].get("p90") for n in names}
            ),
        ]  # fmt: skip
    return rows


def _stream_sizes(run: dict[str, Any]) -> str:
    """ "4×2.0k in, 48 out": the streams' prompt and output sizes (their medians)."""
    streams = run["streams"]
    prompts = [s["prompt_tokens"] for s in streams if s.get("prompt_tokens") is not None]
    outputs = [s["output_tokens"] for s in streams if s.get("output_tokens") is not None]
    if not prompts or not outputs:
        return ""
    prompt, output = percentile(prompts, 50), percentile(outputs, 50)
    return f"{len(streams)}×{_k(round(prompt))} in, {round(output)} out"


def _restart_rows(servers: dict[str, Any], limits: dict[str, Any]) -> list[SummaryRow]:
    """The new session's first turn on a restarted server, against the floor of its new
    tokens (the floor assumes every shared token is already cached)."""
    restart: dict[str, Any] = servers.get("restart") or {}
    if not restart:
        return []
    names = [n for n in servers["targets"] if n in restart] or list(restart)
    floor = _floor(limits, "restart")
    notes = {}
    for name in names:
        note = _cache_note(restart[name])
        ttft = restart[name].get("ttft_s")
        if floor and ttft is not None:
            note += f", {ttft / floor:.2f}× floor"
        notes[name] = note
    return [
        SummaryRow(
            "restart", "new session TTFT", "s", False,
            {n: restart[n].get("ttft_s") for n in names}, floor, notes,
        ),
        SummaryRow(
            "restart", "ready after start", "s", False,
            {n: restart[n].get("ready_s") for n in names}, compare=False,
        ),
    ]  # fmt: skip


def _floor_rows(limits: dict[str, Any]) -> list[SummaryRow]:
    return [
        SummaryRow(
            "prefill floor", f"{f['label']}: {_k(f['new_tokens'])} new of {_k(f['prompt_tokens'])}",
            "s", False, {}, float(f["seconds"]),
        )
        for f in limits.get("prefill_floor", [])
    ]  # fmt: skip


WORKLOADS = ("agent-session", "new-session", "restart", "concurrency", "decode", "prefill floor")
# Workloads on a model of their own, not the one being benchmarked (left out with `--url`).
OWN_MODEL_WORKLOADS = ("tool-loop",)
# Other agents' sessions on the same model and servers, over their own APIs.
OTHER_CLIENT_WORKLOADS = ("codex-session", "replay")
# Our server with a small model beside the main one (`mlx bench --small-model`).
TWO_MODEL_WORKLOADS = (HAIKU_TIER,)
# The order of the table: the sessions first (Codex's beside Claude Code's), then the rest.
ROW_ORDER = (
    WORKLOADS[:1]
    + OTHER_CLIENT_WORKLOADS
    + TWO_MODEL_WORKLOADS
    + WORKLOADS[1:2]
    + OWN_MODEL_WORKLOADS
    + (WORKLOADS[2:])
)


def workload_of(row: SummaryRow) -> str:
    """The workload a row belongs to ("concurrency 4" belongs to "concurrency")."""
    return next(w for w in ROW_ORDER if row.workload.startswith(w))


def summary_rows(servers: dict[str, Any], limits: dict[str, Any]) -> list[SummaryRow]:
    """Every row of the report, grouped by workload in the order of ROW_ORDER."""
    rows = (
        _session_rows(servers, limits)
        + _agent_reuse_row(servers)
        + codex_session_rows(servers)
        + haiku_tier_rows(servers)
        + replay_rows(servers)
        + _tool_loop_rows(servers)
        + _restart_rows(servers, limits)
        + _decode_rows(servers, limits)
        + _concurrency_rows(servers)
        + _floor_rows(limits)
    )
    return sorted(rows, key=lambda r: ROW_ORDER.index(workload_of(r)))
