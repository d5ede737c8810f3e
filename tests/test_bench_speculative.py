"""The speculative-decoding workload: `--speculate auto` beside `off` (and mlx_lm.server with a
draft model) on a copy workload and a no-copy one. Its figures and table from made-up raw
figures, the rounds with fake servers, and one short run through the real servers on the copy
and tiny test models. Counts and shapes are checked, never a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import CountingProgress
from rich.console import Console

from mlxlaunch.bench.clients import StreamTiming
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.peer import PEER_DRAFT_NAME
from mlxlaunch.bench.progress import SilentProgress
from mlxlaunch.bench.speculative import (
    BASE,
    COUNTERS,
    SETTINGS,
    OursSetting,
    SpecServer,
    SpecWorkload,
    measure_workload,
    workload_steps,
)
from mlxlaunch.bench.speculative_report import (
    HEADER,
    PEER_DRAFT_CAVEAT,
    render_speculative_table,
    speculative_markdown,
    speculative_notes,
    speculative_rows,
)
from mlxlaunch.bench.wire import anthropic_body, openai_body
from mlxlaunch.bench.workloads import Conversation, file_rewrite

AUTO = SETTINGS[0].name


def _stream(tokens: int, seconds: float) -> dict[str, Any]:
    """A stream whose `tokens` arrive evenly over `seconds` after a 0.1 s first token."""
    times = [0.1 + seconds * i / (tokens - 1) for i in range(tokens)]
    return {"ttft_s": 0.1, "total_s": times[-1], "output_tokens": tokens,
            "token_times_s": times, "error": None}  # fmt: skip


def _counters(drafted: int, accepted: int, generated: int, requests: int) -> dict[str, int]:
    return dict(zip(COUNTERS, (drafted, accepted, generated, requests), strict=True))


def _figures() -> dict[str, Any]:
    """One copy workload at 1 stream in two rounds: auto decodes 100 tokens in 0.5 s then
    1.0 s, off in 1.0 s both times; the peer in 0.8 s."""

    def results(auto_s: float) -> dict[str, Any]:
        return {
            AUTO: {"wall_s": 1.0, "streams": [_stream(101, auto_s)],
                   "counters": _counters(80, 60, 101, 1)},
            BASE: {"wall_s": 1.0, "streams": [_stream(101, 1.0)],
                   "counters": _counters(0, 0, 101, 1)},
            PEER_DRAFT_NAME: {"wall_s": 1.0, "streams": [_stream(101, 0.8)]},
        }  # fmt: skip

    copy = {
        "workload": "copy", "model": "copy", "description": "rewrite a file",
        "max_tokens": 101, "draft_model": "copy-tiny", "prompt_tokens": 300,
        "servers": [AUTO, BASE, PEER_DRAFT_NAME], "unavailable": {}, "warmup": {},
        "levels": [{"streams": 1, "rounds": [
            {"round": 1, "order": [AUTO, BASE, PEER_DRAFT_NAME], "results": results(0.5)},
            {"round": 2, "order": [BASE, PEER_DRAFT_NAME, AUTO], "results": results(1.0)},
        ]}],
    }  # fmt: skip
    return {"base": BASE, "settings": [s.name for s in SETTINGS], "workloads": [copy]}


def test_rows_give_decode_rates_ratios_acceptance_and_tokens_per_step() -> None:
    auto, off, peer = speculative_rows(_figures())
    assert (auto.server, off.server, peer.server) == (AUTO, BASE, PEER_DRAFT_NAME)
    assert auto.rounds == [pytest.approx(200.0), pytest.approx(100.0)]
    assert auto.decode() == {"min": pytest.approx(100), "median": pytest.approx(150),
                             "max": pytest.approx(200)}  # fmt: skip
    assert auto.round_ratios() == [pytest.approx(2.0), pytest.approx(1.0)]
    assert peer.round_ratios() == [pytest.approx(1.25)] * 2
    # 160 drafted and 120 accepted over the two rounds.
    assert auto.acceptance() == pytest.approx(120 / 160)
    # 202 tokens, 200 after each request's first, in 200 − 120 = 80 steps.
    assert auto.tokens_per_step() == pytest.approx(200 / 80)
    assert off.tokens_per_step() == 1.0 and off.acceptance() is None
    assert peer.acceptance() is None and peer.tokens_per_step() is None  # no counters
    assert "batching off" in peer.notes[0] and "copy-tiny" in peer.notes[0]
    data = auto.as_dict()
    assert data["ratio"] == {"min": pytest.approx(1.0), "median": pytest.approx(1.5),
                             "max": pytest.approx(2.0)}  # fmt: skip
    assert (data["drafted_tokens"], data["accepted_tokens"]) == (160, 120)


def test_a_server_that_did_not_start_is_a_row_with_the_reason() -> None:
    figures = _figures()
    workload = figures["workloads"][0]
    workload["servers"].remove(PEER_DRAFT_NAME)
    workload["unavailable"] = {PEER_DRAFT_NAME: "mlx_lm.server exited with code 1"}
    rows = speculative_rows(figures)
    assert [r.server for r in rows] == [AUTO, BASE, PEER_DRAFT_NAME]
    assert rows[-1].notes == ["did not start: mlx_lm.server exited with code 1"]
    assert rows[-1].decode() == {} and rows[-1].as_dict()["ratio"] == {}
    assert PEER_DRAFT_CAVEAT not in speculative_notes(figures)


def test_a_speculative_server_that_drafted_nothing_says_so() -> None:
    figures = _figures()
    for level_round in figures["workloads"][0]["levels"][0]["rounds"]:
        level_round["results"][AUTO]["counters"] = _counters(0, 0, 101, 1)
    auto = speculative_rows(figures)[0]
    assert auto.notes == ["nothing drafted"] and auto.tokens_per_step() == 1.0


def test_table_and_markdown_have_a_row_per_server() -> None:
    figures = _figures()
    rows = speculative_rows(figures)
    console = Console(width=250, record=True)
    console.print(render_speculative_table(rows, BASE, 2, "title"))
    text = console.export_text()
    assert "1.50× (1.00–2.00)" in text  # the median ratio, then the rounds' range
    assert "75% (120/160)" in text and "2.50" in text and "batching off" in text
    markdown = speculative_markdown(figures, rows, 2)
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    assert lines[0] == "| " + " | ".join(HEADER) + " |"
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == len(HEADER) + 1 for line in lines)
    assert (
        "| copy | 1 | mlxlaunch --speculate auto | 150 tok/s (100–200) | 1.50× (1.00–2.00) |"
        in markdown
    )
    assert "300-token prompt, 101 tokens out" in markdown and PEER_DRAFT_CAVEAT in markdown


def test_a_draft_model_setting_runs_only_where_the_workload_has_a_draft_model() -> None:
    drafting = OursSetting("--draft-model", "draft", draft=True)
    plain = SpecWorkload("no-copy", Path("m"), "m", {}, 8)
    with_draft = SpecWorkload("copy", Path("m"), "m", {}, 8, draft_model=Path("d"))
    assert drafting.engine_options(plain) is None
    assert drafting.engine_options(with_draft) == {"speculate": "draft", "draft_model": "d"}
    assert SETTINGS[0].engine_options(plain) == {"speculate": "auto"}
    assert BASE == "mlxlaunch --speculate off" and drafting.name == "mlxlaunch --draft-model"


def test_the_copy_prompt_is_greedy_on_both_wires_and_unique_per_stream() -> None:
    one, two = file_rewrite("alpha beta", 4, 1), file_rewrite("alpha beta", 4, 2)
    assert one.messages[0].content != two.messages[0].content
    assert "alpha beta" in one.messages[0].content
    assert one.messages[0].content.endswith("Rewrite it.")
    assert anthropic_body(one, max_tokens=4)["temperature"] == 0.0
    assert openai_body(one, max_tokens=4)["temperature"] == 0.0
    assert openai_body(one.with_messages(), max_tokens=4)["temperature"] == 0.0  # kept


class _Server:
    """A fake server: answers at once with `tokens` tokens, logs the order it was asked in,
    and counts drafts as a speculative server would (when `drafts`)."""

    def __init__(self, name: str, log: list[str], drafts: int | None) -> None:
        self.name = name
        self._log = log
        self._drafts = drafts
        self._totals = dict.fromkeys(COUNTERS, 0)

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming:
        self._log.append(self.name)
        self._totals["drafted_tokens"] += self._drafts or 0
        self._totals["accepted_tokens"] += (self._drafts or 0) // 2
        self._totals["generated_tokens"] += max_tokens
        self._totals["requests_completed"] += 1
        times = [0.01 * (i + 1) for i in range(max_tokens)]
        return StreamTiming(ttft_s=0.01, token_times=times, total_s=times[-1],
                            output_tokens=max_tokens)  # fmt: skip

    async def counters(self) -> dict[str, int]:
        return dict(self._totals)

    async def aclose(self) -> None:
        pass


def test_rounds_rotate_the_servers_and_count_each_rounds_drafts() -> None:
    log: list[str] = []
    fakes = [_Server(AUTO, log, 8), _Server(BASE, log, None), _Server(PEER_DRAFT_NAME, log, None)]
    servers = [SpecServer(f, f if f.name != PEER_DRAFT_NAME else None) for f in fakes]  # type: ignore[arg-type]
    prompts = {k: [file_rewrite("x", k, i) for i in range(1, k + 1)] for k in (1, 2)}
    workload = SpecWorkload("copy", Path("m"), "copy", prompts, 5)
    progress = CountingProgress()
    figures = asyncio.run(measure_workload(servers, workload, rounds=3, progress=progress))
    assert progress.steps == workload_steps(workload, 3, 3)
    # The warm-up sends every prompt (1 + 2) to each server once, one token each.
    assert log[:9] == [AUTO] * 3 + [BASE] * 3 + [PEER_DRAFT_NAME] * 3
    assert set(figures["warmup"]) == {AUTO, BASE, PEER_DRAFT_NAME}
    levels = figures["levels"]
    assert [level["streams"] for level in levels] == [1, 2]
    orders = [r["order"][0] for level in levels for r in level["rounds"]]
    assert orders == [AUTO, BASE, PEER_DRAFT_NAME] * 2  # each server goes first in turn
    two = levels[1]["rounds"][0]["results"]
    assert two[AUTO]["counters"] == _counters(16, 8, 10, 2)  # this round's 2 streams only
    assert "counters" not in two[PEER_DRAFT_NAME] and len(two[BASE]["streams"]) == 2


def test_quick_and_full_sizes() -> None:
    full, quick = BenchConfig(), BenchConfig.create(quick=True)
    assert full.speculative and quick.speculative
    assert full.speculative_streams == quick.speculative_streams == (1, 4)
    assert full.speculative_file_words >= 300 and full.speculative_tokens >= 200
    assert quick.speculative_tokens < full.speculative_tokens
    assert BenchConfig.create(speculative=False).speculative is False
    with pytest.raises(ValueError, match="stream counts"):
        BenchConfig.create(speculative_streams=())


@pytest.mark.slow
async def test_both_workloads_run_through_the_real_servers(tiny_model_dir: Path) -> None:
    """auto and off on the copy model and the tiny one, mlx_lm.server with copy-tiny as its
    draft model beside them on the copy workload; a peer that cannot start (here, on the
    no-copy workload: a flag its mlx_lm.server does not know, as an older one would not know
    --draft-model) is reported with why, and the rest goes on."""
    from mlxlaunch.bench.peer import PeerServer
    from mlxlaunch.bench.speculative import (
        run_speculative,
        speculative_workloads,
        start_draft_peers,
    )

    config = BenchConfig.create(
        quick=True, speculative_streams=(1, 2), speculative_file_words=80,
        speculative_tokens=40, decode_tokens=8,
    )  # fmt: skip
    workloads = speculative_workloads(config, str(tiny_model_dir), "tiny")
    assert [w.name for w in workloads] == ["copy", "no-copy"]
    peers = start_draft_peers(workloads)
    assert list(peers) == ["copy"] and "--draft-model" in peers["copy"].command()
    peers["no-copy"] = PeerServer(tiny_model_dir, extra_args=("--no-such-flag",))
    peers["no-copy"].start()
    try:
        figures, warnings = await run_speculative(
            workloads, rounds=1, progress=SilentProgress(), peers=peers
        )
    finally:
        for peer in peers.values():
            peer.stop()
    [warning] = warnings
    assert warning.startswith(f"{PEER_DRAFT_NAME} left out of the no-copy workload: ")
    copy, no_copy = figures["workloads"]
    draft = "mlxlaunch --draft-model"
    assert copy["servers"] == [AUTO, draft, BASE, PEER_DRAFT_NAME]
    assert copy["draft_model"] == "copy-tiny"
    assert no_copy["servers"] == [AUTO, BASE] and no_copy["draft_model"] is None
    assert "exited with code 2" in no_copy["unavailable"][PEER_DRAFT_NAME]
    assert copy["prompt_tokens"] > 80  # the file's words are tokens of their own
    rows = {(r.workload, r.streams, r.server): r for r in speculative_rows(figures)}
    assert len(rows) == 2 * 4 + 2 * 3
    for (workload, _, server), row in rows.items():
        if workload == "no-copy" and server == PEER_DRAFT_NAME:
            assert row.notes[0].startswith("did not start: ") and row.rounds == []
            continue
        assert row.errors == 0 and all(rate is not None for rate in row.rounds), row
    for streams in (1, 2):
        auto, off = rows[("copy", streams, AUTO)], rows[("copy", streams, BASE)]
        by_model = rows[("copy", streams, draft)]
        for row in (auto, by_model):
            assert row.counters is not None
            # Each server tries drafting before it has measured a wide pass (its first level);
            # later it drafts only where this machine's step times say it pays, which on a
            # compute-bound CPU may be never: then nothing is drafted, and that is right.
            if streams == 1:
                assert row.counters["drafted_tokens"] > 0, row
            if row.counters["drafted_tokens"] > 0:
                # The copy model's own forward passes accept most drafts of its copy of the
                # file (prompt lookup's, and copy-tiny's as a draft model).
                acceptance, per_step = row.acceptance(), row.tokens_per_step()
                assert acceptance is not None and acceptance > 0.5, row
                assert per_step is not None and per_step > 1, row
        assert off.counters is not None and off.counters["drafted_tokens"] == 0
        assert off.tokens_per_step() == 1.0
        assert auto.round_ratios()[0] is not None
        # Greedy: every server wrote the whole reply.
        for name in (AUTO, draft, BASE, PEER_DRAFT_NAME):
            [level] = [lv for lv in copy["levels"] if lv["streams"] == streams]
            for stream in level["rounds"][0]["results"][name]["streams"]:
                assert stream["output_tokens"] == 40
