"""The haiku-tier workload (`mlx bench --small-model`): what it sends, its rows, and a short run
on real servers. Checks what is sent, where it was served and what is reported, never a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.haiku_tier import (
    ONE_MODEL,
    SIDE_MODEL_ID,
    WORKLOAD,
    run_haiku_tier,
    side_request,
    tier_plan,
    with_small_model,
)
from mlxlaunch.bench.ours import OURS_NAME
from mlxlaunch.bench.peer import PEER_NAME
from mlxlaunch.bench.progress import SilentProgress
from mlxlaunch.bench.prompt import claude_code_prompt
from mlxlaunch.bench.summary import ROW_ORDER, summary_rows, workload_of
from mlxlaunch.bench.wire import BENCH_MODEL, PEER_MODEL, anthropic_body, openai_body

PROMPT = claude_code_prompt(quick=True)


def test_the_plan_is_a_session_of_its_own_two_main_turns_a_round() -> None:
    config = BenchConfig.create(quick=True, haiku_rounds=3, tool_result_chars=200)
    plan = tier_plan(PROMPT, config)
    assert plan.rounds == 3 and len(plan.main_turns) == 6
    assert plan.side_streams == 4 and plan.side_tokens == config.haiku_side_tokens
    sizes = [len(t.messages) for t in [plan.warmup, *plan.main_turns]]
    assert sizes == [1, 3, 5, 7, 9, 11, 13]  # each turn one tool round trip more
    assert "haiku-tier" in plan.warmup.messages[0].content  # no other workload's prefix
    assert all(t.model is None for t in plan.main_turns)  # the main model's turn


def test_side_requests_name_the_haiku_tier_to_ours_and_the_one_model_to_the_peer() -> None:
    first, second = side_request(1), side_request(2)
    assert first.messages != second.messages and not first.tools
    assert anthropic_body(first, max_tokens=8)["model"] == SIDE_MODEL_ID
    assert "haiku" in SIDE_MODEL_ID
    # mlx_lm.server would try to load a model of that name: it gets its own.
    assert openai_body(first, max_tokens=8)["model"] == PEER_MODEL
    main = tier_plan(PROMPT, BenchConfig.create(quick=True)).main_turns[0]
    assert anthropic_body(main, max_tokens=8)["model"] == BENCH_MODEL


def _timing(ttft: float | None, total: float) -> dict[str, Any]:
    return {"ttft_s": ttft, "total_s": total, "error": None}


def _figures() -> dict[str, Any]:
    small = with_small_model("tiny")

    def results(main_alone: float, main_beside: float, side: float, beside: list[float]) -> Any:
        return {
            "main_alone": _timing(main_alone, main_alone + 1),
            "main_beside": _timing(main_beside, main_beside + 1),
            "side_alone": _timing(0.01, side),
            "side_beside": [_timing(0.01, s) for s in beside],
        }

    return {
        "targets": [small, ONE_MODEL, PEER_NAME],
        "small_model": "tiny",
        "side_streams": 4,
        "rounds": [
            {
                "round": 1,
                "results": {
                    small: results(1.0, 1.1, 0.2, [0.3, 0.5]),
                    ONE_MODEL: results(1.0, 2.0, 0.4, [1.5]),
                    PEER_NAME: results(2.0, 5.0, 0.5, [3.0, 4.0]),
                },
            }
        ],
    }


def test_rows_show_ours_with_the_small_model_beside_the_peer_and_one_model_in_the_note() -> None:
    assert WORKLOAD in ROW_ORDER
    servers = {"haiku_tier": _figures()}
    rows = [r for r in _rows(servers) if r.workload == WORKLOAD]
    by_metric = {r.metric: r for r in rows}
    assert list(by_metric) == [
        "main TTFT alone p50",
        "main TTFT, 4 side streams p50",
        "side request alone p50",
        "side request beside main p50",
    ]
    beside = by_metric["main TTFT, 4 side streams p50"]
    assert beside.values == {OURS_NAME: 1.1, PEER_NAME: 5.0}
    assert beside.notes[OURS_NAME] == "--small-model tiny; one model: 2.00 s"
    assert beside.speedup(OURS_NAME, PEER_NAME) == pytest.approx(5.0 / 1.1)
    assert by_metric["side request beside main p50"].values[OURS_NAME] == pytest.approx(0.4)
    assert all(workload_of(r) == WORKLOAD for r in rows)


def test_no_rows_without_the_workload() -> None:
    assert not [r for r in _rows({}) if r.workload == WORKLOAD]


def _rows(extra: dict[str, Any]) -> list[Any]:
    empty: dict[str, Any] = {
        "targets": [],  # no server ran the other workloads
        "new_session": {"cold": {}, "warm": []},
        "agent_session": [],
        "decode": [],
        "concurrency": [],
        "warmup": {},
    }
    return summary_rows(empty | extra, {"prefill_floor": [], "decode_ceiling": []})


@pytest.mark.slow
async def test_the_side_requests_reach_the_small_model_only_where_one_is_served(
    small_model_dir: Path, tiny_model_dir: Path
) -> None:
    """Three real servers: ours with `tiny` as the small model beside `small`, ours with
    `small` only, mlx_lm.server on `small`; every round ran its side streams beside the main
    turn, and the side requests were served by the small model only where there is one."""
    config = BenchConfig.create(quick=True, haiku_rounds=1, tool_result_chars=600)
    plan = tier_plan(PROMPT, config)
    figures, warnings = await run_haiku_tier(
        plan,
        model_dir=str(small_model_dir),
        small_model_dir=str(tiny_model_dir),
        small_name="tiny",
        progress=SilentProgress(),
    )
    assert warnings == []
    small = with_small_model("tiny")
    assert figures["targets"] == [small, ONE_MODEL, PEER_NAME]
    [round_] = figures["rounds"]
    for name in figures["targets"]:
        result = round_["results"][name]
        for key in ("main_alone", "main_beside", "side_alone"):
            assert result[key]["error"] is None and result[key]["ttft_s"] is not None, name
        assert result["side_beside"], f"{name}: no side request ran beside the main turn"
        assert all(s["error"] is None for s in result["side_beside"])
        # The main turns prefilled only their new tool round: the session's prefix was cached.
        assert result["main_beside"]["cached_tokens"] > 0, name
    served = figures["served_by"]
    assert served[small]["main"] == 2 + 2  # short chat and warm-up turn, two main turns
    # the warm-up's and the one alone, then the side streams' (some ran beside the main turn)
    assert served[small]["small"] >= 2 + len(round_["results"][small]["side_beside"])
    assert set(served[ONE_MODEL]) == {"main"}
    rows = {r.metric: r for r in _rows({"haiku_tier": figures}) if r.workload == WORKLOAD}
    assert all(r.values[OURS_NAME] is not None and r.values[PEER_NAME] is not None
               for r in rows.values())  # fmt: skip
