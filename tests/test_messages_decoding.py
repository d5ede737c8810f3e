"""Decoding plans (which constraint a request gets) and the thinking-budget processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.decoding.grammar import JsonConstraint
from mlxlaunch.engine.decoding.plan import NO_PLAN, needs_plan, plan_decoding
from mlxlaunch.engine.decoding.thinking import ThinkingBudget
from mlxlaunch.engine.types import (
    ChatMessage,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    ToolChoice,
    ToolSpec,
)

TOOL = ToolSpec("Read", "read", {"type": "object", "properties": {"p": {"type": "string"}}})
STRICT = ToolSpec("Write", "write", {"type": "object"}, strict=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def _info(family: str | None) -> ModelInfo:
    return ModelInfo(
        id="m", path="m", context_window=100, think_start="<think>", think_end="</think>",
        tool_format=family,
    )  # fmt: skip


def _request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", "x")], max_tokens=10, **fields)


def _plan(tokenizer: Any, family: str | None = "json_tools", **fields: Any) -> Any:
    return plan_decoding(
        _request(**fields), opens_thinking=False, tokenizer=tokenizer, info=_info(family)
    )


@pytest.mark.slow
def test_plain_requests_need_no_plan(tokenizer: Any) -> None:
    assert not needs_plan(_request(tools=[TOOL]))
    assert _plan(tokenizer, tools=[TOOL]) == NO_PLAN and NO_PLAN.processors() == []


@pytest.mark.slow
def test_which_constraint_applies(tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert isinstance(_plan(tokenizer, response_schema=schema).constraint, JsonConstraint)
    forced = _plan(tokenizer, tools=[TOOL], tool_choice=ToolChoice("any"), response_schema=schema)
    assert forced.constrained and not isinstance(forced.constraint, JsonConstraint)
    assert _plan(tokenizer, tools=[STRICT]).constrained
    # strict is best effort where the syntax has no grammar; forcing a call there is refused
    assert not _plan(tokenizer, "function_gemma", tools=[STRICT]).constrained
    with pytest.raises(InvalidRequest, match="cannot force"):
        _plan(tokenizer, "function_gemma", tools=[TOOL], tool_choice=ToolChoice("any"))
    with pytest.raises(InvalidRequest):
        _plan(tokenizer, response_schema={"type": "object", "properties": {"a": {"type": 7}}})


@pytest.mark.slow
def test_processors_are_fresh_per_sequence(tokenizer: Any) -> None:
    plan = _plan(tokenizer, response_schema={"type": "boolean"}, thinking=True, thinking_budget=3)
    first, second = plan.processors(), plan.processors()
    assert [type(p) for p in first] == [ThinkingBudget, type(first[1])]
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert plan.thinking_budget is not None and plan.thinking_budget.budget == 3
    assert _plan(tokenizer, thinking=False, thinking_budget=3).thinking_budget is None


def _step(processor: ThinkingBudget, context: list[int], vocab: int = 12) -> int | None:
    """Run one step; the forced token, or None when the logits were left alone."""
    logits = mx.zeros((1, vocab))
    out = processor(mx.array(context), logits)
    row = cast(list[float], out[0].tolist())
    allowed = [i for i, v in enumerate(row) if v != float("-inf")]
    return allowed[0] if len(allowed) == 1 else None


def test_budget_forces_a_multi_token_end_marker_then_lets_go() -> None:
    budget = ThinkingBudget(3, start_ids=[1], end_ids=[8, 9], inside=False)
    context = [5, 5]  # the prompt
    assert _step(budget, context) is None
    for token in [1, 4, 4]:  # opens the span, thinks two tokens
        context.append(token)
        assert _step(budget, context) is None
    context.append(4)  # the third thinking token: budget spent
    assert _step(budget, context) == 8
    context.append(8)
    assert _step(budget, context) == 9
    context.append(9)
    assert _step(budget, context) is None and not budget.inside and budget.cut
    context += [1]  # a new span after the budget is spent closes at once
    assert _step(budget, context) == 8


def test_a_span_closed_by_the_model_is_not_cut() -> None:
    budget = ThinkingBudget(5, start_ids=[1], end_ids=[2], inside=True)
    context = [7]
    _step(budget, context)
    for token in [4, 4, 2, 6, 6, 6, 6, 6]:
        context.append(token)
        assert _step(budget, context) is None
    assert budget.spent == 2 and not budget.cut
