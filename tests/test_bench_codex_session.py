"""The Codex-session workload: the requests it sends (Codex CLI's own, grown per turn), how it
reads the Responses stream, its rows in the report, and a run against our real server and
mlx_lm.server (which has no Responses API, and the report says so). Checks what is sent and
reported, and the prefix reuse; never a time."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from mlxlaunch.bench.clients import StreamTiming
from mlxlaunch.bench.codex_session import (
    CAPTURES,
    ResponsesTarget,
    codex_capture,
    codex_session,
    measure_codex_session,
    no_endpoint,
    on_responses_event,
)
from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.ours import start_local_server
from mlxlaunch.bench.peer import PeerServer
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.progress import SilentProgress
from mlxlaunch.bench.report import format_value
from mlxlaunch.bench.summary import (
    REUSE_METRIC,
    ROW_ORDER,
    codex_session_rows,
    summary_rows,
    workload_of,
)
from mlxlaunch.protocol.openai_responses import ResponsesRequest

OURS, PEER = "mlxlaunch", "mlx_lm.server"
FIXTURES = Path(__file__).parent / "fixtures" / "codex-0.171.0"
PACKAGED = Path(__file__).parent.parent / "mlxlaunch" / "bench" / "data"


def test_packaged_captures_are_the_fixtures() -> None:
    for index, name in enumerate(CAPTURES):
        fixture = FIXTURES / f"responses-request-{index}.json"
        assert (PACKAGED / name).read_bytes() == fixture.read_bytes()


def test_session_is_request_0_then_request_1_then_grows_by_a_call_and_its_output() -> None:
    bodies = codex_session(turns=5, tool_result_chars=300, max_output_tokens=4)
    assert len(bodies) == 5
    extra = {"max_output_tokens": 4, "temperature": 1.0}
    for index, body in enumerate(bodies[:2]):  # the two captured requests, as Codex sent them
        assert body == {**codex_capture(index), **extra}
    captured_call, captured_output = codex_capture(1)["input"][-2:]
    for before, after in itertools.pairwise(bodies):
        old = before["input"]
        assert after["input"][: len(old)] == old  # everything resent, byte for byte
        call, output = after["input"][len(old) :]
        assert call.keys() == captured_call.keys() and output.keys() == captured_output.keys()
        assert call["type"] == "function_call" and call["name"] == "exec_command"
        assert json.loads(call["arguments"]).keys() == {"cmd"}
        assert output["type"] == "function_call_output"
        assert output["call_id"] == call["call_id"]
        assert {k: v for k, v in after.items() if k != "input"} == {
            k: v for k, v in before.items() if k != "input"
        }
    assert len(bodies[-1]["input"][-1]["output"].split("Output:\n", 1)[1]) == 300
    calls = [i["call_id"] for i in bodies[-1]["input"] if i["type"] == "function_call"]
    assert len(set(calls)) == 4
    assert codex_session(turns=5, tool_result_chars=300, max_output_tokens=4) == bodies
    for body in bodies:  # our protocol layer takes every one of them
        ResponsesRequest.model_validate(body)
    with pytest.raises(ValueError):
        codex_session(turns=0, tool_result_chars=1, max_output_tokens=1)


def test_plan_has_the_session_unless_turned_off() -> None:
    config = BenchConfig.create(quick=True)
    plan = build_plan(config)
    assert len(plan.codex) == config.turns
    assert plan.codex[0]["max_output_tokens"] == config.turn_max_tokens
    assert build_plan(BenchConfig.create(quick=True, codex_session=False)).codex == []


def _event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


def test_stream_timing_counts_content_deltas_and_reads_the_final_usage() -> None:
    timing = StreamTiming()
    usage = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
             "output_tokens": 0}  # fmt: skip
    final = {**usage, "output_tokens": 3}
    events = [
        ("response.created", _event("response.created", response={"usage": usage}), 0.01),
        ("response.output_item.added", _event("response.output_item.added", item={}), 0.02),
        ("response.reasoning_summary_text.delta",
         _event("response.reasoning_summary_text.delta", delta=""), 0.03),
        ("response.reasoning_summary_text.delta",
         _event("response.reasoning_summary_text.delta", delta="hm"), 0.05),
        ("response.output_text.delta", _event("response.output_text.delta", delta="hi"), 0.07),
        ("response.completed", _event("response.completed", response={"usage": final}), 0.08),
    ]  # fmt: skip
    for kind, data, now in events:
        on_responses_event(kind, data, timing, now)
    assert timing.ttft_s == 0.05 and timing.token_times == [0.05, 0.07]
    assert (timing.prompt_tokens, timing.cached_tokens, timing.output_tokens) == (120, 100, 3)
    assert timing.error is None
    failed = {"usage": usage, "error": {"code": "server_error", "message": "boom"}}
    on_responses_event("response.failed", _event("response.failed", response=failed), timing, 1)
    assert timing.error and "boom" in timing.error


def test_an_http_404_means_no_responses_api_but_a_400_does_not() -> None:
    assert no_endpoint(StreamTiming(error="HTTP 404: Not Found")) == (
        "no Responses API: POST /v1/responses answered HTTP 404"
    )
    assert no_endpoint(StreamTiming(error="HTTP 400: {}")) is None
    assert no_endpoint(StreamTiming()) is None


class _FakeTarget:
    """A Responses server that reports `cached` of each turn's prompt, or has no endpoint."""

    def __init__(self, name: str, *, endpoint: bool = True) -> None:
        self.name = name
        self.endpoint = endpoint
        self.sent: list[int] = []

    async def send(self, body: dict[str, Any]) -> StreamTiming:
        self.sent.append(len(body["input"]))
        if not self.endpoint:
            return StreamTiming(error="HTTP 404: Not Found")
        prompt = 1000 * len(body["input"])
        cached = prompt - 1000 * 2 if len(body["input"]) > 4 else 0
        return StreamTiming(ttft_s=0.1, prompt_tokens=prompt, cached_tokens=cached)

    async def aclose(self) -> None:
        pass


def test_measure_leaves_out_a_server_without_the_api_after_its_first_answer() -> None:
    ours, peer = _FakeTarget(OURS), _FakeTarget(PEER, endpoint=False)
    bodies = codex_session(turns=3, tool_result_chars=10, max_output_tokens=1)
    figures = asyncio.run(
        measure_codex_session([ours, peer], bodies, progress=SilentProgress())  # type: ignore[list-item]
    )
    assert ours.sent == [4, 6, 8] and peer.sent == [4]
    assert figures["unsupported"] == {
        PEER: "no Responses API: POST /v1/responses answered HTTP 404"
    }
    turns = figures["turns"]
    assert [list(t["results"]) for t in turns] == [[OURS]] * 3
    assert [t["results"][OURS]["reuse"] for t in turns] == [None, 1.0, 1.0]

    servers = {"codex_session": figures}
    rows = codex_session_rows(servers)
    assert [r.metric for r in rows] == [
        "turn 1 TTFT", "turn 2 TTFT", "turn 3 TTFT", "turns 2–3 TTFT p50",
        REUSE_METRIC,
    ]  # fmt: skip
    assert all(r.workload == "codex-session" for r in rows)
    assert all(r.values[PEER] is None for r in rows)
    assert "HTTP 404" in rows[0].notes[PEER]  # what it answered, once
    assert all(r.notes[PEER] == "no Responses API" for r in rows[1:])
    assert all(r.speedup(OURS, PEER) is None for r in rows)  # no ratio made up for the peer
    assert rows[1].notes[OURS] == "4.0k/6.0k cached, 100.00% of turn 1"
    assert rows[-1].values[OURS] == 1.0 and format_value(rows[-1].values[OURS], "%") == "100.00%"


def test_codex_rows_sit_beside_the_claude_code_session() -> None:
    assert ROW_ORDER.index("codex-session") == ROW_ORDER.index("agent-session") + 1
    timing = {"ttft_s": 0.1, "prompt_tokens": 100, "cached_tokens": 0, "error": None,
              "output_tokens": 2, "token_times_s": [0.1], "total_s": 0.2}  # fmt: skip
    both = {OURS: timing, PEER: timing}
    later = {OURS: {**timing, "prompt_tokens": 200, "cached_tokens": 99}, PEER: timing}
    servers = {
        "targets": [OURS, PEER],
        "new_session": {"cold": both, "warm": [both]},
        "agent_session": [{"turn": 1, "results": both}, {"turn": 2, "results": later}],
        "decode": [{n: {**timing, "tokens_per_s": 10.0} for n in (OURS, PEER)}],
        "concurrency": [],
        "codex_session": {
            "targets": [OURS, PEER], "unsupported": {PEER: "no Responses API"},
            "turns": [{"turn": 1, "results": {OURS: {**timing, "reuse": None}}}],
        },
    }  # fmt: skip
    rows = summary_rows(servers, {"prefill_floor": [], "decode_ceiling": []})
    workloads = [workload_of(r) for r in rows]
    assert workloads.index("codex-session") > max(
        i for i, w in enumerate(workloads) if w == "agent-session"
    )
    reuse = next(r for r in rows if r.workload == "agent-session" and r.metric == REUSE_METRIC)
    assert reuse.values == {OURS: 0.99, PEER: 0.0}  # the Claude Code session's, for both


# --- against real servers ----------------------------------------------------------------


@pytest.mark.slow
def test_codex_session_on_our_server_reuses_the_previous_prompt(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Four Codex turns on our server (tiny model) and mlx_lm.server: ours reads ≥ 99% of each
    previous prompt from its cache; the peer is reported as having no Responses API."""
    bodies = codex_session(turns=4, tool_result_chars=1_500, max_output_tokens=4)

    async def run(cache_dir: Path) -> dict[str, Any]:
        peer = PeerServer(tiny_model_dir)
        peer.start()
        local = await start_local_server(str(tiny_model_dir), cache_dir=cache_dir)
        targets = [ResponsesTarget(OURS, local.url, auth_token=local.auth_token)]
        try:
            await asyncio.to_thread(peer.wait_ready, 120)
            targets.append(ResponsesTarget(PEER, peer.url))
            return await measure_codex_session(targets, bodies, progress=SilentProgress())
        finally:
            for target in targets:
                await target.aclose()
            local.stop()
            peer.stop()

    figures = asyncio.run(run(tmp_path / "cache"))
    turns = [t["results"][OURS] for t in figures["turns"]]
    print("(prompt, cached, reuse) per turn:",
          [(t["prompt_tokens"], t["cached_tokens"], t["reuse"]) for t in turns])  # fmt: skip
    assert all(t["error"] is None and t["ttft_s"] is not None for t in turns)
    assert turns[0]["prompt_tokens"] > 5_000  # Codex's whole prompt: instructions and tools
    prompts = [t["prompt_tokens"] for t in turns]
    assert prompts == sorted(prompts) and len(set(prompts)) == 4  # grows every turn
    assert all(t["reuse"] >= 0.99 for t in turns[1:]), [t["reuse"] for t in turns]
    assert figures["unsupported"] == {
        PEER: "no Responses API: POST /v1/responses answered HTTP 404"
    }

    rows = codex_session_rows({"codex_session": figures})
    assert [r.metric for r in rows][:4] == [f"turn {k} TTFT" for k in (1, 2, 3, 4)]
    reuse = rows[-1]
    least = reuse.values[OURS]
    assert reuse.unit == "%" and least is not None and least >= 0.99
    assert reuse.values[PEER] is None and "no Responses API" in reuse.notes[PEER]
