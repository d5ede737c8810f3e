"""The speculative-decoding table: a row per workload, stream count and server, from the raw
figures of `bench.speculative`. Pure functions over those figures, no timing.

- decode tokens/s, per round: each stream's tokens after its first over the span from the
  earliest first token to the latest last one (`stats.decode_span_rate`); min/median/max of
  the rounds.
- ratio: each round's figure over the same round's `--speculate off` figure; min/median/max.
- acceptance: accepted / drafted tokens, from our server's `/v1/stats` counters around the
  rounds (the peer reports none).
- tokens per step: each decode step of a sequence emits its sampled token plus the drafts it
  accepted, so a sequence's steps are its tokens after the first less the accepted drafts;
  tokens per step is those tokens over those steps (1.00 without speculation). Derived from
  the counters, not counted by the engine: a draft accepted in a sequence's last step but cut
  by `max_tokens` makes it a little high.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from mlxlaunch.bench.peer import PEER_DRAFT_NAME
from mlxlaunch.bench.report import format_speedup, format_value
from mlxlaunch.bench.stats import decode_span_rate, speedup, spread
from mlxlaunch.bench.summary import format_rate

PEER_DRAFT_NOTE = "batching off"
# Said under the table when the peer ran with a draft model.
PEER_DRAFT_CAVEAT = (
    "mlx_lm.server turns batching off when it has a draft model: its streams run one after another"
)


def round_decode_rate(run: dict[str, Any]) -> float | None:
    """Decode tokens/s of one server's round (its failed streams left out)."""
    return decode_span_rate(
        [
            (stream.get("output_tokens") or len(stream["token_times_s"]), stream["token_times_s"])
            for stream in run["streams"]
            if not stream.get("error")
        ]
    )


@dataclass
class SpecRow:
    """One server at one stream count of one workload, over its rounds."""

    workload: str
    streams: int
    server: str
    rounds: list[float | None]  # decode tokens/s of each round
    base_rounds: list[float | None]  # the base's, in the same rounds
    counters: dict[str, int] | None = None  # summed over the rounds (our servers only)
    errors: int = 0
    notes: list[str] = field(default_factory=list)

    def decode(self) -> dict[str, float]:
        return spread(self.rounds)

    def round_ratios(self) -> list[float | None]:
        pairs = zip(self.rounds, self.base_rounds, strict=False)
        return [speedup(a, b, higher_is_better=True) for a, b in pairs]

    def acceptance(self) -> float | None:
        """Accepted over drafted tokens (None: no counters, or nothing drafted)."""
        if not self.counters or not self.counters["drafted_tokens"]:
            return None
        return self.counters["accepted_tokens"] / self.counters["drafted_tokens"]

    def tokens_per_step(self) -> float | None:
        """Tokens each decode step emitted per sequence, on average (see the module doc)."""
        if not self.counters:
            return None
        after_first = self.counters["generated_tokens"] - self.counters["requests_completed"]
        steps = after_first - self.counters["accepted_tokens"]
        return after_first / steps if after_first > 0 and steps > 0 else None

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report."""
        ratios = self.round_ratios()
        return {
            "workload": self.workload,
            "streams": self.streams,
            "server": self.server,
            "decode_tokens_per_s": self.decode(),
            "rounds": self.rounds,
            "ratio": spread(ratios),
            "round_ratios": ratios,
            "acceptance": self.acceptance(),
            "drafted_tokens": self.counters["drafted_tokens"] if self.counters else None,
            "accepted_tokens": self.counters["accepted_tokens"] if self.counters else None,
            "tokens_per_step": self.tokens_per_step(),
            "errors": self.errors,
            "notes": self.notes,
        }


def _summed(runs: list[dict[str, Any]]) -> dict[str, int] | None:
    """Counters summed over runs (None when any run has none)."""
    if not runs or any("counters" not in run for run in runs):
        return None
    return {name: sum(run["counters"][name] for run in runs) for name in runs[0]["counters"]}


def speculative_rows(figures: dict[str, Any]) -> list[SpecRow]:
    """Every row of the table: per workload and stream count, each server that ran (then each
    that did not start, with why)."""
    base: str = figures["base"]
    rows = []
    for workload in figures.get("workloads", []):
        for level in workload["levels"]:
            rounds = level["rounds"]

            def rates(name: str, rs: list[dict[str, Any]] = rounds) -> list[float | None]:
                return [round_decode_rate(r["results"][name]) if name in r["results"] else None
                        for r in rs]  # fmt: skip

            for name in workload["servers"]:
                runs = [r["results"][name] for r in rounds]
                errors = sum(1 for run in runs for s in run["streams"] if s.get("error"))
                row = SpecRow(
                    workload["workload"], level["streams"], name, rates(name), rates(base),
                    _summed(runs), errors,
                )  # fmt: skip
                if name == PEER_DRAFT_NAME:
                    row.notes.append(f"{PEER_DRAFT_NOTE}, draft model {workload['draft_model']}")
                if errors:
                    row.notes.append(f"{errors} streams failed")
                if row.counters is not None and name != base and not row.acceptance():
                    row.notes.append("nothing drafted")
                rows.append(row)
            for name, reason in workload.get("unavailable", {}).items():
                rows.append(
                    SpecRow(
                        workload["workload"], level["streams"], name, [], [],
                        notes=[f"did not start: {reason}"],
                    )
                )  # fmt: skip
    return rows


def _ratio_text(row: SpecRow, base: str, *, markup: bool) -> str:
    if row.server == base:
        return ""
    ratios = spread(row.round_ratios())
    if not ratios:
        return "—" if markup else "–"
    text = format_speedup(ratios["median"]) if markup else f"{ratios['median']:.2f}×"
    if len(row.rounds) > 1:
        span = f"({ratios['min']:.2f}–{ratios['max']:.2f})"
        text += f" [dim]{span}[/]" if markup else f" {span}"
    return text


def _decode_text(row: SpecRow, *, markup: bool) -> str:
    decode = row.decode()
    if not decode:
        return "—" if markup else "–"
    text = format_value(decode["median"], "tok/s")
    if len(row.rounds) > 1:
        span = f"({format_rate(decode['min'])}–{format_rate(decode['max'])})"
        text += f" [dim]{span}[/]" if markup else f" {span}"
    return text


def _cells(row: SpecRow, base: str, *, markup: bool) -> list[str]:
    """The cells after workload and streams: server (with notes), decode, ratio, acceptance,
    tokens per step."""
    none = "—" if markup else "–"
    acceptance, per_step = row.acceptance(), row.tokens_per_step()
    accepted = ""
    if acceptance is not None and row.counters:
        counts = f"{row.counters['accepted_tokens']}/{row.counters['drafted_tokens']}"
        accepted = f"{acceptance:.0%} " + (f"[dim]({counts})[/]" if markup else f"({counts})")
    notes = "; ".join(row.notes)
    server = row.server + ((f" [dim]({notes})[/]" if markup else f" ({notes})") if notes else "")
    return [
        server,
        _decode_text(row, markup=markup),
        _ratio_text(row, base, markup=markup),
        accepted or none,
        f"{per_step:.2f}" if per_step is not None else none,
    ]


HEADER = ("workload", "streams", "server", "decode tokens/s", "ratio", "acceptance", "tokens/step")


def caption(base: str, rounds: int) -> str:
    """How to read the table."""
    return (
        f"decode tokens/s: median of {rounds} rounds (min–max) · ratio: against {base} in the "
        "same round · acceptance: accepted/drafted tokens (/v1/stats) · tokens/step: tokens per "
        "decode step of a sequence (derived: steps = tokens after the first − accepted)"
    )


def render_speculative_table(rows: list[SpecRow], base: str, rounds: int, title: str) -> Table:
    """The rich table for the terminal."""
    table = Table(
        title=title, title_justify="left", caption=caption(base, rounds), caption_justify="left"
    )
    for name in HEADER:
        table.add_column(name, justify="left" if name in HEADER[:3] else "right")
    previous: tuple[str, int] | None = None
    for row in rows:
        key = (row.workload, row.streams)
        first = key != previous
        table.add_row(
            row.workload if first else "",
            str(row.streams) if first else "",
            *_cells(row, base, markup=True),
            end_section=False,
        )
        previous = key
    return table


def speculative_markdown(figures: dict[str, Any], rows: list[SpecRow], rounds: int) -> str:
    """The table in Markdown, with what each workload is."""
    base = figures["base"]
    lines = ["**Speculative decoding**", "", *(f"- {n}" for n in speculative_notes(figures))]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        cells = [row.workload, str(row.streams), *_cells(row, base, markup=False)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", caption(base, rounds) + "."]
    return "\n".join(lines) + "\n"


def speculative_notes(figures: dict[str, Any]) -> list[str]:
    """What each workload is, and how the peer ran, for the lines under the table."""
    workloads = figures.get("workloads", [])
    notes = [
        f"{w['workload']}: model {w['model']}, {w['description']}, "
        + (f"{w['prompt_tokens']}-token prompt, " if w.get("prompt_tokens") else "")
        + f"{w['max_tokens']} tokens out"
        for w in workloads
    ]
    if any(PEER_DRAFT_NAME in w["servers"] for w in workloads):
        notes.append(PEER_DRAFT_CAVEAT)
    return notes
