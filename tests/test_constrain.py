"""Constrained decoding with real generation: a random-weight test model (the hardest case,
since nothing but the grammar keeps its output in shape) sampled at temperature 1 through
mlx-lm's BatchGenerator, which calls processors exactly as the engine's scheduler does."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import jsonschema
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    GrammarLogitsProcessor,
    JsonConstraint,
    llg_tokenizer,
)
from mlxlaunch.engine.types import InvalidRequest
from mlxlaunch.testing import ensure_test_model

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

SCHEMAS: list[dict[str, Any]] = [
    {  # Claude Code's session-title schema, with its string bounded
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 16}},
        "required": ["title"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "level": {"enum": ["low", "mid", "high"]},
            "score": {"type": "integer", "minimum": -5, "maximum": 250},
            "ok": {"type": "boolean"},
        },
        "required": ["level", "score", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 4},
                "maxItems": 3,
            },
        },
        "required": ["user", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 1,
        "maxItems": 4,
    },
    {"enum": ["yes", "no", 3, None]},
]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, TokenizerWrapper]:
    loaded = mlx_lm.load(str(ensure_test_model("tiny")))
    return loaded[0], loaded[1]


def prompt_tokens(tokenizer: TokenizerWrapper, text: str = "Answer in JSON.") -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=False
    )
    return list(rendered)


def generate(
    model: Any,
    tokenizer: TokenizerWrapper,
    processors: Sequence[GrammarLogitsProcessor],
    max_tokens: int,
    seed: int = 0,
) -> list[tuple[list[int], str | None]]:
    """Generate one sequence per processor in one batch; (tokens without EOS, finish reason)."""
    mx.random.seed(seed)
    prompt = prompt_tokens(tokenizer)
    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        sampler=make_sampler(temp=1.0),
        completion_batch_size=len(processors),
        prefill_batch_size=len(processors),
    )
    uids = generator.insert(
        [prompt] * len(processors),
        max_tokens=[max_tokens] * len(processors),
        logits_processors=[[p] for p in processors],
    )
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    finished: dict[int, str | None] = {}
    try:
        while len(finished) < len(uids):
            for response in generator.next_generated():
                if response.token not in tokenizer.eos_token_ids:
                    tokens[response.uid].append(response.token)
                if response.finish_reason is not None:
                    finished[response.uid] = response.finish_reason
    finally:
        generator.close()
    return [(tokens[uid], finished[uid]) for uid in uids]


def test_fifty_constrained_generations_parse_and_validate(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    processors: list[GrammarLogitsProcessor] = []
    schemas: list[dict[str, Any]] = []
    for schema in SCHEMAS:
        constraint = JsonConstraint.from_schema(tokenizer, schema)
        for _ in range(10):
            processors.append(constraint.logits_processor())
            schemas.append(schema)
    started = time.perf_counter()
    results = generate(model, tokenizer, processors, max_tokens=80)
    elapsed = time.perf_counter() - started
    outputs = set()
    for (tokens, reason), schema, processor in zip(results, schemas, processors, strict=True):
        text = tokenizer.decode(tokens)
        assert reason == "stop", f"cut at max_tokens: {text!r}"
        assert processor.complete and processor.error is None
        value = json.loads(text)
        jsonschema.validate(value, schema)
        outputs.add(text)
    assert len(outputs) > 25  # sampled, not one forced string repeated
    assert elapsed < 30


def test_a_cut_by_max_tokens_is_detected(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    essay = {"type": "string", "minLength": 200}  # cannot fit in 12 tokens
    schema = {"type": "object", "properties": {"essay": essay}, "required": ["essay"]}
    processor = JsonConstraint.from_schema(tokenizer, schema).logits_processor()
    [(tokens, reason)] = generate(model, tokenizer, [processor], max_tokens=12)
    assert reason == "length"
    assert len(tokens) == 12
    assert not processor.complete
    assert tokenizer.decode(tokens).startswith('{"essay": "')
    with pytest.raises(json.JSONDecodeError):
        json.loads(tokenizer.decode(tokens))


def allowed_ids(processor: GrammarLogitsProcessor, tokens: list[int], vocab: int) -> set[int]:
    out = processor(mx.array(tokens), mx.zeros((1, vocab)))
    return {int(i) for i in np.nonzero(np.array(out[0]) > -np.inf)[0]}


def test_a_complete_sentence_allows_only_end_of_sequence(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    vocab = model.args.vocab_size
    processor = JsonConstraint.from_schema(tokenizer, {"enum": ["yes"]}).logits_processor()
    prompt = prompt_tokens(tokenizer)
    first = allowed_ids(processor, prompt, vocab)
    assert tokenizer.eos_token_ids.isdisjoint(first)  # nothing written yet: cannot end
    answer = tokenizer.encode('"yes"', add_special_tokens=False)
    assert answer[0] in first
    sequence = prompt + answer
    for n in range(len(prompt) + 1, len(sequence) + 1):
        allowed = allowed_ids(processor, sequence[:n], vocab)
    assert allowed == set(tokenizer.eos_token_ids)
    assert processor.complete
    # The pipelined loop feeds the sampled EOS once more; that is an ending, not an error.
    allowed_ids(processor, [*sequence, next(iter(tokenizer.eos_token_ids))], vocab)
    assert processor.ended and processor.error is None and processor.complete


def test_logits_past_the_tokenizer_vocabulary_are_masked(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    processor = JsonConstraint.from_schema(tokenizer, {"type": "boolean"}).logits_processor()
    padded = llg_tokenizer(tokenizer).vocab_size + 100  # models pad embeddings
    allowed = allowed_ids(processor, prompt_tokens(tokenizer), padded)
    assert allowed and max(allowed) < llg_tokenizer(tokenizer).vocab_size
    texts = {tokenizer.decode([t]) for t in allowed}
    assert all("true".startswith(t) or "false".startswith(t) for t in texts)


def test_processors_are_independent(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    constraint = JsonConstraint.from_schema(tokenizer, {"enum": ["ab", "cd"]})
    first, second = constraint.logits_processor(), constraint.logits_processor()
    prompt = prompt_tokens(tokenizer)
    vocab = llg_tokenizer(tokenizer).vocab_size
    allowed_ids(first, prompt, vocab)
    before = allowed_ids(second, prompt, vocab)
    allowed_ids(first, prompt + tokenizer.encode('"ab', add_special_tokens=False), vocab)
    assert allowed_ids(second, prompt, vocab) == before


def test_the_tokenizer_conversion_is_cached(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    assert llg_tokenizer(tokenizer) is llg_tokenizer(tokenizer)


@pytest.mark.parametrize(
    "schema",
    [{"type": "object", "properties": {"a": {"type": "nonsense"}}}, {"$ref": "#/nowhere"}],
)
def test_a_schema_that_cannot_compile_is_an_invalid_request(
    tiny: tuple[Any, Any], schema: dict[str, Any]
) -> None:
    _, tokenizer = tiny
    with pytest.raises(InvalidRequest):
        JsonConstraint.from_schema(tokenizer, schema)


def test_json_after_an_open_think_span(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    constraint = JsonConstraint.from_schema(tokenizer, {"type": "integer"}, think_end="</think>")
    processor = constraint.logits_processor()
    prompt = prompt_tokens(tokenizer)
    vocab = llg_tokenizer(tokenizer).vocab_size
    think_end = tokenizer.encode("</think>", add_special_tokens=False)
    output = tokenizer.encode("some thought", add_special_tokens=False) + think_end
    output += tokenizer.encode("\n\n42", add_special_tokens=False)
    sequence = prompt + output
    allowed = allowed_ids(processor, prompt, vocab)
    for n in range(len(prompt), len(sequence)):
        assert sequence[n] in allowed, tokenizer.decode(sequence[len(prompt) : n + 1])
        allowed = allowed_ids(processor, sequence[: n + 1], vocab)
    assert processor.complete


def test_mask_overhead_per_token(tiny: tuple[Any, Any]) -> None:
    """Time of one processor call (mask + apply), amortised over a constrained run."""
    _, tokenizer = tiny
    constraint = GrammarConstraint.from_lark(tokenizer, "start: /[a-z ]{0,400}/")
    processor = constraint.logits_processor()
    vocab = 152_064  # a Qwen-sized logits row: the unpack runs over the whole row
    logits = mx.zeros((1, vocab))
    tokens = prompt_tokens(tokenizer)
    mx.eval(processor(mx.array(tokens), logits))
    step = tokenizer.encode("ab", add_special_tokens=False)[:1]
    started = time.perf_counter()
    n = 200
    for _ in range(n):
        tokens = tokens + step
        mx.eval(processor(mx.array(tokens), logits))
    per_token_us = (time.perf_counter() - started) / n * 1e6
    print(f"constrained decoding overhead: {per_token_us:.0f} µs/token at vocab {vocab}")
    assert processor.error is None
    assert per_token_us < 5_000
