"""What a family's grammar writes, the reader made from the same record reads back.

Each dialect record (`store/dialects.py`) generates both the constraint grammar and the
streaming reader. For every record with markup, a random model samples forced calls under the
grammar, and the text is fed, in random pieces, to the output parser set up for that record
(our reader, or mlx-lm's parser where the record says so): every output must be whole calls
of offered tools whose arguments match their schemas, with nothing left over as text. A made-up
family that shares a known shape works the same way from its record alone, with no other code.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import mlx_lm
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from test_constrain import allowed_ids, generate, prompt_tokens
from test_constrain_tools import BASH, WEATHER

from mlxlaunch.engine.decoding.grammar import GrammarConstraint
from mlxlaunch.engine.decoding.tool_grammar import supported_families, tool_call_constraint
from mlxlaunch.engine.output.families import span_reader_for
from mlxlaunch.engine.output.parser import OutputParser, ParserConfig
from mlxlaunch.engine.types import TextDelta, ToolCallEvent, ToolChoice, ToolSpec
from mlxlaunch.store.dialects import (
    DIALECTS,
    Dialect,
    JsonEnvelope,
    Notation,
    ParamElements,
)
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import TEMPLATE_FAMILIES

pytestmark = pytest.mark.slow  # builds and samples a model

RECORDS = [d for d in DIALECTS.values() if d.markup is not None]

# Beside the strings, integers and enums of test_constrain_tools' tools: booleans and arrays.
TAGS = ToolSpec("Tag", "Tag a file", {"type": "object", "required": ["path", "pinned"]})
TAGS.parameters["properties"] = {
    "path": {"type": "string", "maxLength": 12},
    "pinned": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
}
TOOLS = [BASH, WEATHER, TAGS]
SCHEMAS = {t.name: {k: v for k, v in t.parameters.items() if k != "$schema"} for t in TOOLS}

# Two families no table knows, each of a shape that is: XML-ish elements and a JSON envelope.
ACME = Dialect(
    "acme_elements",
    "<acme:calls>",
    "</acme:calls>",
    ParamElements(
        *('<acme:tool name="', '">', "<acme:arg key=", ">", "</acme:arg>", "</acme:tool>"),
        gap="\n",
        values="minimax",
        strip_values=True,
    ),
    mlx_lm_parser=False,
    section=True,
    section_open="\n",
)
ROCKET = Dialect(
    "rocket_envelope",
    "<rocket>",
    "</rocket>",
    JsonEnvelope(None, "<call>", "<args>", "</call>"),
    mlx_lm_parser=False,
    separator="\n",
)


def _markers(dialect: Dialect) -> set[str]:
    """The markers a real tokenizer of this family holds as single tokens."""
    found = {dialect.tool_call_start or "", dialect.tool_call_end or ""}
    markup = dialect.markup
    if isinstance(markup, ParamElements) and markup.tag_tokens:
        found |= {markup.param_open, markup.key_close, markup.value_open, markup.value_close}
    if isinstance(markup, JsonEnvelope):
        found |= {markup.call_open, markup.arguments_open, markup.call_close}
        found |= {markup.call_id or ""}
    if isinstance(markup, Notation) and markup.kind == "gemma4":
        found.add('<|"|>')
    return found - {""}


Loaded = tuple[Any, TokenizerWrapper]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Dialect], Loaded]]:
    """A tiny model per family whose tokenizer holds that family's markers as added tokens
    (as its real tokenizer does), each built once for the module."""
    cache: dict[str, Loaded] = {}
    qwen = TEMPLATE_FAMILIES["qwen"]

    def load(dialect: Dialect) -> Loaded:
        if dialect.name not in cache:
            tokens = [*qwen.markup_tokens, *sorted(_markers(dialect))]
            family = dataclasses.replace(
                qwen, name=dialect.name, markup_tokens=tuple(dict.fromkeys(tokens))
            )
            path = build_model(tmp_path_factory.mktemp(dialect.name), "tiny", template=family)
            model, tokenizer = mlx_lm.load(str(path))[:2]
            cache[dialect.name] = (model, tokenizer)
        return cache[dialect.name]

    yield load


def parser_for(dialect: Dialect) -> OutputParser:
    """The output parser as the engine sets it up for `dialect`: the reader generated from
    the record, or mlx-lm's parser of that name where the record has none of ours."""
    reader = span_reader_for(dialect, TOOLS)
    tool_parser = None
    if reader is None:
        tool_parser = importlib.import_module(f"mlx_lm.tool_parsers.{dialect.name}").parse_tool_call
    return OutputParser(
        ParserConfig(
            tool_call_start=dialect.tool_call_start,
            tool_call_end=dialect.tool_call_end,
            tool_parser=tool_parser,
            span_reader=reader,
            leading_call=dialect.leading_call,
            tools=list(TOOLS),
            calls_forced=True,
        )
    )


def read_back(dialect: Dialect, text: str, rng: random.Random) -> list[tuple[str, Any]]:
    """The calls the record's reader finds in `text`, fed in random pieces; no text may be
    left over."""
    parser = parser_for(dialect)
    events = []
    position = 0
    while position < len(text):
        step = rng.randint(1, 7)
        events += parser.feed(text[position : position + step])
        position += step
    events += parser.finish()
    leftover = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert not leftover.strip(), f"{dialect.name} left text: {leftover!r} of {text!r}"
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    return [(c.name, json.loads(c.arguments)) for c in calls]


def sampled_round_trip(
    model: Any, tokenizer: TokenizerWrapper, dialect: Dialect, *, parallel: bool, seed: int
) -> int:
    """Sample forced calls under `dialect`'s grammar and read each output back; the number of
    calls read."""
    choice = ToolChoice("any", parallel=parallel)
    constraint = tool_call_constraint(tokenizer, TOOLS, choice, dialect=dialect)
    assert constraint is not None
    processors = [constraint.logits_processor() for _ in range(4)]
    results = generate(model, tokenizer, processors, max_tokens=200, seed=seed)
    rng = random.Random(seed)
    count = 0
    for (tokens, reason), processor in zip(results, processors, strict=True):
        if reason != "stop":  # cut by max_tokens: not a whole call, nothing to read back
            continue
        assert processor.complete
        text = tokenizer.decode(tokens)
        calls = read_back(dialect, text, rng)
        assert calls, f"{dialect.name}: no call read from {text!r}"
        assert parallel or len(calls) == 1
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
        count += len(calls)
    return count


@pytest.mark.parametrize("dialect", RECORDS, ids=[d.name for d in RECORDS])
def test_what_the_grammar_writes_the_records_reader_reads(
    models: Callable[[Dialect], Loaded], dialect: Dialect
) -> None:
    model, tokenizer = models(dialect)
    parallel = dialect.leading_call is None
    read = sum(
        sampled_round_trip(model, tokenizer, dialect, parallel=parallel, seed=seed)
        for seed in (1, 2, 3)
    )
    assert read >= 3, f"{dialect.name}: too few whole samples to judge"


def test_every_record_with_markup_has_a_grammar() -> None:
    assert supported_families() == sorted(d.name for d in RECORDS)


def follows(constraint: GrammarConstraint, tokenizer: TokenizerWrapper, text: str) -> bool:
    processor = constraint.logits_processor()
    prompt = prompt_tokens(tokenizer)
    sequence = prompt + tokenizer.encode(text, add_special_tokens=False)
    vocab = len(tokenizer.vocab)
    for n in range(len(prompt), len(sequence)):
        if sequence[n] not in allowed_ids(processor, sequence[:n], vocab):
            return False
    return bool(allowed_ids(processor, sequence, vocab) & set(tokenizer.eos_token_ids))


# A call in each made-up family's markup, as its record spells it (arguments in schema order).
NEW_FAMILY_CALLS = {
    "acme_elements": (
        "<acme:calls>\n"
        '<acme:tool name="get_weather">\n<acme:arg key=city>Oslo</acme:arg>\n'
        "<acme:arg key=days>3</acme:arg>\n<acme:arg key=unit>c</acme:arg>\n</acme:tool>\n"
        "</acme:calls>"
    ),
    "rocket_envelope": (
        '<rocket><call>get_weather<args>{"city": "Oslo", "days": 3, "unit": "c"}</call></rocket>'
    ),
}


@pytest.mark.parametrize("dialect", [ACME, ROCKET], ids=[ACME.name, ROCKET.name])
def test_a_new_record_of_a_known_shape_needs_no_other_code(
    models: Callable[[Dialect], Loaded], dialect: Dialect
) -> None:
    model, tokenizer = models(dialect)
    assert dialect.name not in DIALECTS
    text = NEW_FAMILY_CALLS[dialect.name]
    constraint = tool_call_constraint(tokenizer, TOOLS, ToolChoice("any"), dialect=dialect)
    assert constraint is not None
    assert follows(constraint, tokenizer, text)
    assert not follows(constraint, tokenizer, text.replace("city", "town"))
    expected = ("get_weather", {"city": "Oslo", "unit": "c", "days": 3})
    for seed in range(3):
        assert read_back(dialect, text, random.Random(seed)) == [expected]
    assert sampled_round_trip(model, tokenizer, dialect, parallel=True, seed=4) >= 1
    # Its arguments stream: the reader is ours, generated from the record.
    assert span_reader_for(dialect, TOOLS) is not None
