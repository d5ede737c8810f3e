"""Speculative decoding through the engine, on a model that really copies (testing/copying.py).

The copy model's forward pass predicts the next word of a fixed chain; a prompt holding that
chain's text (a file with a few words changed) makes its reply a copy of the file, so the
prompt-lookup drafts are accepted by the model's own forward passes, not by a script. Every
reply is compared with the same engine's reply under `--speculate off`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import collect, run, text_of

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.drafting import speculation_unavailable
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest, Sampling, TextDelta
from mlxlaunch.testing.copying import chain_text, load_chain

pytestmark = pytest.mark.slow  # the tests load a model


@pytest.fixture(scope="module")
def copy_model_dir() -> Path:
    from mlxlaunch.testing import ensure_test_model

    return ensure_test_model("copy")


@pytest.fixture(scope="module")
def engines(copy_model_dir: Path) -> Iterator[dict[str, Engine]]:
    made = {
        mode: Engine(EngineConfig(model=str(copy_model_dir), speculate=mode))
        for mode in ("auto", "off")
    }
    for engine in made.values():
        engine.start()
    yield made
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="module")
def file_text(copy_model_dir: Path) -> str:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(copy_model_dir)
    return chain_text(tokenizer, load_chain(copy_model_dir), 300, edit_every=25)


def rewrite(file_text: str, max_tokens: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", f"Here is the file:\n{file_text}\nRewrite it.")],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        **kw,
    )


async def both(engines: dict[str, Engine], request: GenerationRequest) -> tuple[Done, str, str]:
    """The speculative engine's Done and text, and the plain engine's text."""
    done, text = await run(engines["auto"], request)
    _, plain = await run(engines["off"], request)
    return done, text, plain


async def test_a_copy_is_drafted_accepted_and_exact(
    engines: dict[str, Engine], file_text: str
) -> None:
    done, text, plain = await both(engines, rewrite(file_text, 200))
    assert text == plain and len(text) > 500
    timings = done.timings
    # How much is drafted depends on what a wide pass costs on this machine (measured as
    # it runs); what is drafted, the model's own forward passes mostly accept (the file's
    # edits reject a few).
    assert timings.drafted_tokens >= 10
    assert timings.accepted_tokens >= 0.7 * timings.drafted_tokens, timings
    stats = engines["auto"].stats().counters
    assert stats.accepted_tokens >= timings.accepted_tokens > 0
    assert engines["off"].stats().counters.drafted_tokens == 0


async def test_a_stop_sequence_inside_an_accepted_run_ends_the_output_where_it_would(
    engines: dict[str, Engine], file_text: str
) -> None:
    words = file_text.split()
    stop = f" {words[60]} {words[61]}"
    done, text, plain = await both(engines, rewrite(file_text, 200, stop_sequences=[stop]))
    assert text == plain and stop not in text
    assert done.stop_reason == "stop_sequence" and done.stop_sequence == stop


async def test_a_schema_constrained_reply_is_exact_with_drafts(
    engines: dict[str, Engine], file_text: str
) -> None:
    """The grammar sees drafted tokens as it sees sampled ones and takes back the rejected:
    the constrained reply is the plain one, and valid."""
    import json

    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 150}},
        "required": ["summary"],
        "additionalProperties": False,
    }
    request = rewrite(file_text, 300, response_schema=schema)
    _, text, plain = await both(engines, request)
    assert text == plain
    assert isinstance(json.loads(text)["summary"], str)


async def test_the_next_turn_after_a_speculative_reply_is_the_plain_one(
    engines: dict[str, Engine], file_text: str
) -> None:
    """What a speculative turn left in the prefix cache serves the next turn as a plain
    engine's does: the same text, the same reuse."""
    first = rewrite(file_text, 120)
    _, reply, _ = await both(engines, first)
    second = GenerationRequest(
        messages=[*first.messages, ChatMessage("assistant", reply), ChatMessage("user", "Again.")],
        max_tokens=80,
        sampling=Sampling(temperature=0.0),
    )
    again, text = await run(engines["auto"], second)
    plain_again, plain = await run(engines["off"], second)
    assert text == plain
    assert again.usage.cached_tokens == plain_again.usage.cached_tokens > 300


async def test_cancelling_a_drafting_stream_leaves_the_engine_serving(
    engines: dict[str, Engine], file_text: str
) -> None:
    engine = engines["auto"]
    request = rewrite(file_text, 400, request_id="cancel-me")
    seen = 0
    async for event in engine.submit(request):
        if isinstance(event, TextDelta):
            seen += 1
            if seen == 20:
                engine.cancel("cancel-me")
        if isinstance(event, Done):
            assert event.stop_reason == "cancelled"
    done, text, plain = await both(engines, rewrite(file_text, 60))
    assert text == plain and done.stop_reason == "max_tokens"


async def test_streams_drafting_at_once_are_each_exact(
    engines: dict[str, Engine], file_text: str
) -> None:
    lengths = (90, 150, 40, 120)
    requests = [rewrite(file_text, n) for n in lengths]
    speculative = await asyncio.gather(*(collect(engines["auto"].submit(r)) for r in requests))
    plain = [await run(engines["off"], r) for r in requests]
    assert [text_of(events) for events in speculative] == [text for _, text in plain]


def test_models_whose_caches_cannot_roll_back_do_not_draft() -> None:
    """A sliding-window model (its layers keep rotating caches) decodes plain under `auto`;
    `--speculate off` and a cluster never draft."""
    from mlx_lm.models import gemma3_text

    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=64,
        num_key_value_heads=1,
        sliding_window=8,
        sliding_window_pattern=2,
    )
    windowed = gemma3_text.Model(args)
    reason = speculation_unavailable("auto", windowed, cluster=False)
    assert reason is not None and "RotatingKVCache" in reason
    from small_models import random_qwen3

    plain = random_qwen3()
    assert speculation_unavailable("auto", plain, cluster=False) is None
    assert speculation_unavailable("lookup", plain, cluster=True) is not None
    assert speculation_unavailable("off", plain, cluster=False) == "--speculate off"


@pytest.fixture(scope="module")
def draft_engine(copy_model_dir: Path) -> Iterator[Engine]:
    from mlxlaunch.testing import ensure_test_model

    draft = ensure_test_model("copy-tiny")  # the same chain and tokenizer, in the tiny shape
    engine = Engine(
        EngineConfig(model=str(copy_model_dir), speculate="draft", draft_model=str(draft))
    )
    engine.start()
    yield engine
    engine.close()


async def test_a_draft_model_drafts_for_text_found_nowhere_in_the_context(
    draft_engine: Engine, engines: dict[str, Engine]
) -> None:
    """A prompt that holds none of the reply: prompt lookup has nothing to propose, the draft
    model (which follows the same chain) proposes the reply, and the output is the plain one."""
    request = GenerationRequest(
        messages=[ChatMessage("user", "Say something.")],
        max_tokens=150,
        sampling=Sampling(temperature=0.0),
    )
    done, text = await run(draft_engine, request)
    _, plain = await run(engines["off"], request)
    lookup, _ = await run(engines["auto"], request)
    assert text == plain
    assert lookup.timings.drafted_tokens < 10  # the chain never repeats within 150 tokens
    assert done.timings.drafted_tokens >= 10
    assert done.timings.accepted_tokens >= 0.9 * done.timings.drafted_tokens


async def test_draft_model_streams_at_once_are_each_exact(
    draft_engine: Engine, engines: dict[str, Engine], file_text: str
) -> None:
    requests = [rewrite(file_text, n) for n in (60, 130, 90)]
    speculative = await asyncio.gather(*(collect(draft_engine.submit(r)) for r in requests))
    plain = [await run(engines["off"], r) for r in requests]
    assert [text_of(events) for events in speculative] == [text for _, text in plain]
    # The second turn's draft prefill reuses the draft model's own prefix cache.
    again = await asyncio.gather(*(collect(draft_engine.submit(r)) for r in requests))
    assert [text_of(events) for events in again] == [text for _, text in plain]


def test_a_draft_model_with_another_vocabulary_is_refused(
    copy_model_dir: Path, tmp_path: Path
) -> None:
    from mlxlaunch.engine.runtime.loader import load_model
    from mlxlaunch.engine.scheduling.speculation import plan_speculation
    from mlxlaunch.errors import ModelLoadError
    from mlxlaunch.testing import build_model

    other = build_model(tmp_path / "other", "tiny", template="mistral")  # other added tokens
    config = EngineConfig(model=str(copy_model_dir), speculate="draft", draft_model=str(other))
    loaded = load_model(config)
    try:
        plan_speculation(config, loaded, cluster=False)
    except ModelLoadError as exc:
        assert "vocabulary" in exc.message or "ends its turns" in exc.message
    else:
        raise AssertionError("a draft model with another vocabulary was accepted")


def test_served_speculation_reports_its_drafts_on_every_surface(
    copy_model_dir: Path, file_text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a real server and the Anthropic SDK: the streamed reply is the plain one, and
    the drafts show in the request's log line, /v1/stats and /metrics."""
    import logging

    import anthropic
    import httpx
    from engine_helpers import served_engine

    token = "t0ken"
    prompt = f"Here is the file:\n{file_text}\nRewrite it."
    texts = {}
    for mode in ("auto", "off"):
        with served_engine(copy_model_dir, token, speculate=mode) as (_, handle):
            client = anthropic.Anthropic(base_url=handle.url, api_key=token)
            with (
                caplog.at_level(logging.INFO, logger="mlxlaunch.server"),
                client.messages.stream(
                    model="claude-sonnet-4-5",
                    max_tokens=160,
                    messages=[{"role": "user", "content": prompt}],
                    extra_body={"temperature": 0.0},  # the SDK no longer names it
                ) as stream,
            ):
                texts[mode] = "".join(stream.text_stream)
            headers = {"authorization": f"Bearer {token}"}
            stats = httpx.get(f"{handle.url}/v1/stats", headers=headers).json()
            metrics = httpx.get(f"{handle.url}/metrics", headers=headers).text
            counters = stats["counters"]
            if mode == "auto":
                assert counters["accepted_tokens"] > 0, counters
                assert stats["recent"][-1]["drafted_tokens"] == counters["drafted_tokens"]
                assert "mlxlaunch_accepted_tokens_total" in metrics
                logged = [r.getMessage() for r in caplog.records if " draft=" in r.getMessage()]
                accepted = counters["accepted_tokens"]
                assert any(f"draft={accepted}/" in line for line in logged), logged
            else:
                assert counters["drafted_tokens"] == 0
    assert texts["auto"] == texts["off"] and texts["auto"]
