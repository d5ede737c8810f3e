"""Robustness II, item 9: grammar compilation cannot stall other requests or mislead a client.

A 214-byte pattern `^(x{1000}){1000}$` used to cost 1-10 s of worker time per request (every
running stream waited) and end as a 200 `end_turn` with `{"`; a 10 MB enum worked seconds
before its 400. Now: inputs are bounded before compiling (a 400 naming the field), llguidance
runs under limits and a CPU budget per mask, compilation and warming run off the tokenizer lock
and are remembered by grammar text, and a grammar that breaks mid-generation fails its request.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding import grammar, schema_limits
from mlxlaunch.engine.decoding.grammar import ConstraintBroken, JsonConstraint, grammar_cache
from mlxlaunch.engine.decoding.grammar_cache import GrammarCache
from mlxlaunch.engine.decoding.plan import DecodingPlan, plan_decoding
from mlxlaunch.engine.decoding.schema_limits import pattern_size
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationFailed,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    ToolChoice,
    ToolSpec,
)
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here loads a tokenizer or a model

BOMB = "^(x{1000}){1000}$"  # the 214-byte request carried this pattern


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def _info() -> ModelInfo:
    return ModelInfo(id="m", path="m", context_window=100, tool_format="json_tools")


def _plan(tokenizer: Any, lock: threading.Lock | None = None, **fields: Any) -> DecodingPlan:
    request = GenerationRequest(messages=[ChatMessage("user", "x")], max_tokens=10, **fields)
    return plan_decoding(
        request, opens_thinking=False, tokenizer=tokenizer, info=_info(), lock=lock
    )


def _string_with(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}


# --- bounded before compiling: a 400 naming the field ------------------------------------


def test_the_pattern_bomb_is_refused_at_once_naming_the_field(tokenizer: Any) -> None:
    start = time.perf_counter()
    with pytest.raises(
        InvalidRequest, match=r"output_config\.format\.schema\.properties\.a\.pattern"
    ):
        _plan(tokenizer, response_schema=_string_with(BOMB))
    assert time.perf_counter() - start < 0.5


def test_sibling_inputs_are_bounded_where_the_client_wrote_them(tokenizer: Any) -> None:
    huge_enum = {"type": "object", "properties": {"e": {"enum": list(range(20_000))}}}
    with pytest.raises(InvalidRequest, match=r"schema\.properties\.e\.enum: enum too large"):
        _plan(tokenizer, response_schema=huge_enum)
    ten_mb = {"type": "object", "description": "x" * (10 << 20)}
    with pytest.raises(InvalidRequest, match="schema too large"):
        _plan(tokenizer, response_schema=ten_mb)
    keyed = {"type": "object", "patternProperties": {BOMB: {"type": "string"}}}
    with pytest.raises(InvalidRequest, match="patternProperties"):
        _plan(tokenizer, response_schema=keyed)
    tool = ToolSpec("t", "d", _string_with("(ab{100}){200}"))
    with pytest.raises(InvalidRequest, match=r"tools\['t'\]\.input_schema\.properties\.a\.pattern"):
        _plan(tokenizer, tools=[tool], tool_choice=ToolChoice("any"))


def test_pattern_sizes_count_nested_repetitions() -> None:
    assert pattern_size(BOMB) == 1_000_000
    assert pattern_size("^(ab){2}c$") == 5
    assert pattern_size("^[a-z]{1,64}$") == 64
    assert pattern_size("^(\\d{1,3}\\.){3}\\d{1,3}$") == 15
    assert pattern_size("a{" + "9" * 5000 + "}") > schema_limits.MAX_PATTERN_REPEAT  # no crash


# --- compiled under limits: what the checks miss fails fast, at plan time -----------------


def test_a_grammar_past_the_engines_limits_is_a_400_at_plan_time(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema_limits, "MAX_PATTERN_REPEAT", 10**18)  # only llguidance left
    start = time.perf_counter()
    with pytest.raises(InvalidRequest, match="too complex"):
        _plan(tokenizer, response_schema=_string_with(BOMB) | {"required": ["a"]})
    assert time.perf_counter() - start < 5  # seconds of worker time before; bounded fuel now


def test_a_grammar_whose_every_mask_is_slow_is_a_400(tokenizer: Any) -> None:
    # All forced: no llguidance limit bounds the forced-run scan (0.3-0.5 s per token).
    names = [f"key{i}" * 5 for i in range(3000)]
    schema = {
        "type": "object",
        "properties": {name: {"const": i} for i, name in enumerate(names)},
        "required": names,
        "additionalProperties": False,
    }
    with pytest.raises(InvalidRequest, match="too complex"):
        _plan(tokenizer, response_schema=schema)


# --- cached by grammar text ----------------------------------------------------------------


def test_identical_grammars_are_compiled_once(tokenizer: Any) -> None:
    tools = [ToolSpec("Bash", "run", {"type": "object", "properties": {"cmd": {"type": "string"}}})]
    cache = grammar_cache(tokenizer)
    before = cache.compiled
    first = _plan(tokenizer, tools=tools, tool_choice=ToolChoice("any"))
    second = _plan(tokenizer, tools=tools, tool_choice=ToolChoice("any"))
    assert cache.compiled == before + 1
    assert first.constraint is not None and second.constraint is not None
    assert first.constraint.compiled is second.constraint.compiled
    one, two = first.processors()[0], second.processors()[0]
    assert one is not two  # sequences never share a matcher


def test_concurrent_identical_compiles_run_once_and_refusals_are_remembered() -> None:
    cache: GrammarCache[str] = GrammarCache()
    calls: list[int] = []
    gate = threading.Event()

    def slow() -> str:
        calls.append(1)
        gate.wait(5)
        return "compiled"

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("g", slow))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    gate.set()
    for thread in threads:
        thread.join()
    assert results == ["compiled"] * 8 and len(calls) == 1

    def refuse() -> str:
        calls.append(1)
        raise InvalidRequest("too complex")

    for _ in range(3):
        with pytest.raises(InvalidRequest, match="too complex"):
            cache.get("bomb", refuse)
    assert len(calls) == 2


def test_the_cache_is_bounded_in_count_and_bytes() -> None:
    cache: GrammarCache[int] = GrammarCache(max_entries=3, max_bytes=100)
    for i in range(5):
        cache.get(f"g{i}", partial(int, i))
    assert len(cache) == 3
    cache.get("x" * 97, lambda: 9)
    assert len(cache) == 2  # 97 bytes and one 2-byte grammar fit in 100, not two
    cache.get("y" * 200, lambda: 7)  # larger than the whole cache: compiled, not kept
    assert "y" * 200 not in cache._entries


# --- off the shared path: compiling does not hold the tokenizer lock -----------------------


def test_compiling_does_not_hold_the_tokenizer_lock(tokenizer: Any) -> None:
    lock = threading.Lock()
    _plan(tokenizer, lock=lock, response_schema={"type": "integer"})  # markers remembered
    done = threading.Event()
    schema = _string_with("^[a-z]{1,9}$") | {"required": ["a"]}  # a grammar not seen yet

    def plan() -> None:
        _plan(tokenizer, lock=lock, response_schema=schema)
        done.set()

    with lock:  # another request rendering, or the worker detokenizing
        thread = threading.Thread(target=plan)
        thread.start()
        assert done.wait(10), "planning waited for the tokenizer lock"
    thread.join()


# --- never invalid output: a grammar that breaks mid-generation fails its request ----------


def _drive(plan: DecodingPlan, tokens: list[int]) -> Any:
    (processor,) = plan.processors()
    vocab = 151_936
    logits = mx.zeros((1, vocab))
    context = [1]
    processor(mx.array(context), logits)
    for token in tokens:
        context.append(token)
        processor(mx.array(context), logits)
    return processor


def test_a_token_the_grammar_cannot_follow_breaks_the_plan(tokenizer: Any) -> None:
    plan = _plan(tokenizer, response_schema={"type": "integer"})
    plan.check()  # nothing generated yet: fine
    _drive(plan, tokenizer.encode('"oops"', add_special_tokens=False))
    with pytest.raises(ConstraintBroken) as caught:
        plan.check()
    assert isinstance(caught.value, GenerationFailed)  # the worker's per-job failure path


def test_masks_that_keep_costing_too_much_break_the_plan(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tokenizer, response_schema={"type": "string"})
    monkeypatch.setattr(grammar, "MAX_MASK_CPU_S", -1.0)  # every mask "too slow"
    processor = _drive(plan, [])
    assert processor.error is None  # one slow mask is tolerated (a lazily built lexeme)
    _drive(plan, tokenizer.encode('"abc', add_special_tokens=False))
    with pytest.raises(ConstraintBroken, match="too slow"):
        plan.check()


def test_a_compiled_schema_still_constrains(tokenizer: Any) -> None:
    constraint = JsonConstraint.from_schema(tokenizer, {"type": "integer"})
    processor = constraint.logits_processor()
    masked = processor(mx.array([1]), mx.zeros((1, 151_936)))
    allowed = int(np.count_nonzero(np.array(masked[0]) > -1e30))
    assert 0 < allowed < 151_936 and processor.error is None


async def test_output_that_left_its_grammar_ends_as_an_error_not_end_turn(
    tiny_model_dir: Path,
) -> None:
    scripted = ScriptedOutput()
    scripted.enqueue('"not an integer"')  # forced past the grammar, as a broken matcher would
    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=scripted))
    engine.start()
    try:
        request = GenerationRequest(
            messages=[ChatMessage("user", "x")], max_tokens=20, response_schema={"type": "integer"}
        )
        events: list[Any] = []
        with pytest.raises(GenerationFailed, match="grammar"):
            async for event in engine.submit(request):
                events.append(event)
        assert not any(isinstance(e, Done) for e in events)
    finally:
        engine.close()
