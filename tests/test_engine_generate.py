"""Engine: one request at a time through the real tiny model, tokenizer and output parser."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import LogitsRecorder, collect, recording_hook, text_of
from mlx_lm import load, stream_generate

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    Admitted,
    ChatMessage,
    Done,
    GenerationRequest,
    Progress,
    PromptTooLong,
    Sampling,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
)
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

GREEDY = Sampling(temperature=0.0)


def request(text: str = "hello there", max_tokens: int = 12, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", text)], max_tokens=max_tokens, sampling=GREEDY, **kw
    )


async def test_submit_streams_admitted_progress_deltas_done(engine: Engine) -> None:
    req = request(max_tokens=10)
    events = await collect(engine.submit(req))

    admitted = events[0]
    assert isinstance(admitted, Admitted)
    assert admitted.prompt_tokens == await engine.count_tokens(req)
    assert admitted.max_tokens == 10 and not admitted.clamped
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and progress[-1].done_tokens == progress[-1].total_tokens
    done = events[-1]
    assert isinstance(done, Done)
    assert done.usage.prompt_tokens == admitted.prompt_tokens
    assert done.usage.cached_tokens == 0
    # A random model rarely says EOS: either it ran to max_tokens or it ended its turn early.
    assert (done.stop_reason, done.usage.output_tokens) == ("max_tokens", 10) or (
        done.stop_reason == "end_turn" and done.usage.output_tokens <= 10
    )
    assert done.timings.ttft_s > 0
    assert sum(isinstance(e, Done) for e in events) == 1


async def test_greedy_output_is_deterministic_and_matches_mlx_lm(tiny_model_dir: Path) -> None:
    probes: list[LogitsRecorder] = []
    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=recording_hook(probes)))
    try:
        req = request("the quick brown fox", max_tokens=16)
        first = await collect(engine.submit(req))
        second = await collect(engine.submit(req))
    finally:
        engine.close()
    done_1, done_2 = first[-1], second[-1]
    assert isinstance(done_1, Done) and isinstance(done_2, Done)
    assert text_of(first) == text_of(second)
    assert done_1.stop_reason == done_2.stop_reason
    assert done_1.usage.output_tokens == done_2.usage.output_tokens
    # the identical second request is served from the prefix cache (all but the last token)
    assert done_2.usage.cached_tokens == done_2.usage.prompt_tokens - 1
    assert probes[0].context == probes[1].context and probes[0].steps == probes[1].steps

    # mlx-lm's own single-stream generator sees the same logits and picks the same tokens.
    model, tokenizer = load(str(tiny_model_dir))[:2]
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "the quick brown fox"}],
            add_generation_prompt=True,
            enable_thinking=False,
            tokenize=False,
        ),
        add_special_tokens=False,
    )
    reference = LogitsRecorder()
    tokens = [
        r.token
        for r in stream_generate(
            model, tokenizer, prompt, max_tokens=16, logits_processors=[reference]
        )
    ]
    assert len(tokens) == done_1.usage.output_tokens
    # The batch stops computing once a sequence ends: its processors saw every token but the
    # last (no pass is run after it).
    assert probes[0].context == prompt + tokens[:-1]
    n = len(tokens)
    # Flattened: pytest.approx compares nested tuples exactly, not approximately.
    expected = [x for step in probes[0].steps[:n] for x in step]
    assert [x for step in reference.steps[:n] for x in step] == pytest.approx(expected, rel=1e-4)


async def test_scripted_text_ends_turn_with_exact_usage(
    engine: Engine, scripted: ScriptedOutput, tiny_model_dir: Path
) -> None:
    scripted.enqueue("Hello from the engine.")
    req = request(max_tokens=50)
    events = await collect(engine.submit(req))
    assert text_of(events) == "Hello from the engine."
    done = events[-1]
    assert isinstance(done, Done) and done.stop_reason == "end_turn"
    info = engine.model_info
    assert info is not None
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    script_tokens = tokenizer.encode("Hello from the engine.", add_special_tokens=False)
    assert done.usage.output_tokens == len(script_tokens) + 1  # the EOS token counts


async def test_multibyte_characters_are_never_split(
    engine: Engine, scripted: ScriptedOutput, tiny_model_dir: Path
) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    phrase = "héllo 世界"
    ids = tokenizer.encode(phrase, add_special_tokens=False)
    # Precondition: at least one character really is spread over several tokens.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    scripted.enqueue(tokens=ids)
    events = await collect(engine.submit(request(max_tokens=40)))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == phrase
    assert all("\ufffd" not in d for d in deltas)


async def test_prompt_over_the_window_is_refused_before_any_work(tiny_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(tiny_model_dir), context_length=16))
    try:
        req = request("a rather long prompt " * 8)
        n = await engine.count_tokens(req)
        assert n > 16
        with pytest.raises(PromptTooLong) as caught:
            await collect(engine.submit(req))
        assert str(caught.value) == f"prompt is too long: {n} tokens > 16 maximum"
        assert engine.stats().counters.requests_refused == 1
        assert engine.stats().counters.requests_admitted == 0
    finally:
        engine.close()


async def test_max_tokens_is_clamped_to_the_window(tiny_model_dir: Path) -> None:
    scripted = ScriptedOutput()
    probe = Engine(EngineConfig(model=str(tiny_model_dir)))
    req = request(max_tokens=100)
    n = await probe.count_tokens(req)
    probe.close()
    engine = Engine(
        EngineConfig(model=str(tiny_model_dir), context_length=n + 5, logits_hook=scripted)
    )
    try:
        scripted.enqueue("one two three four five six seven eight nine ten")
        events = await collect(engine.submit(req))
        admitted, done = events[0], events[-1]
        assert isinstance(admitted, Admitted) and isinstance(done, Done)
        assert admitted.max_tokens == 5 and admitted.clamped
        assert done.stop_reason == "context_window"
        assert done.usage.output_tokens == 5
    finally:
        engine.close()


async def test_stop_sequence_ends_generation(engine: Engine, scripted: ScriptedOutput) -> None:
    scripted.enqueue("alpha beta STOP gamma delta epsilon zeta eta theta")
    events = await collect(engine.submit(request(max_tokens=60, stop_sequences=["STOP"])))
    done = events[-1]
    assert isinstance(done, Done)
    assert done.stop_reason == "stop_sequence" and done.stop_sequence == "STOP"
    assert text_of(events) == "alpha beta "
    assert "gamma" not in text_of(events)
    assert engine.stats().running == 0


async def test_tool_call_and_thinking_become_events(
    engine: Engine, scripted: ScriptedOutput
) -> None:
    scripted.enqueue(
        "<think>\nlet me look\n</think>\n\n"
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    bash = ToolSpec("Bash", "Run a command", {"type": "object", "properties": {}})
    events = await collect(engine.submit(request(max_tokens=80, tools=[bash])))
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert thinking == "let me look"
    assert [(c.name, c.arguments) for c in calls] == [("Bash", '{"command": "ls"}')]
    assert text_of(events) == ""
    done = events[-1]
    assert isinstance(done, Done) and done.stop_reason == "tool_use"


async def test_stats_count_completed_requests(engine: Engine) -> None:
    await collect(engine.submit(request(max_tokens=4)))
    stats = engine.stats()
    assert stats.state == "loaded"
    assert stats.counters.requests_admitted == stats.counters.requests_completed == 1
    assert stats.counters.generated_tokens == stats.recent[-1].output_tokens
    assert stats.recent[-1].outcome in ("max_tokens", "end_turn")
    assert stats.running == 0 and stats.queue_depth == 0
    # Speeds are read over windows the worker closes when it goes idle.
    for _ in range(200):
        if engine.stats().decode_tps > 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats().decode_tps > 0 and engine.stats().prefill_tps > 0
    assert engine.stats().memory_active_bytes > 0


async def test_a_cut_inside_a_multibyte_character_leaves_no_replacement_char(
    engine: Engine, scripted: ScriptedOutput, tiny_model_dir: Path
) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    ids = tokenizer.encode("ok 世界", add_special_tokens=False)
    # Cut max_tokens right after a token that leaves a character incomplete.
    cut = next(n for n in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:n]))
    scripted.enqueue(tokens=ids)
    events = await collect(engine.submit(request(max_tokens=cut)))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "\ufffd" not in text
    assert text == tokenizer.decode(ids[:cut]).rstrip("\ufffd").rstrip()
    assert events[-1].stop_reason == "max_tokens"
