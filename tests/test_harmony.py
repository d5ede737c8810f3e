"""Harmony (gpt-oss): the output parser turns channel messages into thinking, text and streamed
tool calls without leaking markup; the forced-call grammar makes a gpt-oss test model (the real
template and special tokens) write calls that parser reads back, valid for the tool's schema."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import mlx_lm
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from parser_helpers import splits

from mlxlaunch.engine.decoding.harmony_grammar import (
    harmony_schema_constraint,
    harmony_tool_constraint,
)
from mlxlaunch.engine.output.harmony import HarmonyEvent, HarmonyParser
from mlxlaunch.engine.output.parser import ParserConfig
from mlxlaunch.engine.types import (
    InvalidRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolChoice,
    ToolInputDelta,
    ToolSpec,
)

TEMPLATE = Path(__file__).parent / "fixtures" / "chat-templates" / "gpt-oss-120b.jinja"
FACTS = json.loads(TEMPLATE.with_suffix(".tokens.json").read_text("utf-8"))
MARKUP = "<|start|> <|end|> <|message|> <|channel|> <|call|> <|return|> <|constrain|> <|endoftext|>"
MARKERS = MARKUP.split()

BASH = ToolSpec(
    "Bash",
    "Run a command.",
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "command": {"type": "string", "maxLength": 12},
            "timeout": {"type": "integer", "minimum": 0, "maximum": 600000},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)
WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TOOLS = [BASH, WEATHER]

CALL = (
    "<|channel|>commentary to=functions.Bash <|constrain|>json<|message|>"
    '{"command": "ls -la", "timeout": 5}'
)
OUTPUTS = [
    FACTS["tool_call"]["assistant_turn_as_rendered"],
    "<|channel|>analysis<|message|>The user wants 4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 4.",
    "<|channel|>commentary<|message|>Listing files.<|end|><|start|>assistant" + CALL,
    ' to=functions.Bash<|channel|>commentary json<|message|>{"command": "pwd"}',
    "Just an answer, no header.",
    "<|channel|>final<|message|>  indented\n\nsecond  \n",
]


def config(**overrides: Any) -> ParserConfig:
    values: dict[str, Any] = {"tools": list(TOOLS)}
    values.update(overrides)
    return ParserConfig(**values)


def parse(pieces: list[str], **overrides: Any) -> list[HarmonyEvent]:
    parser = HarmonyParser(config(**overrides))
    events: list[HarmonyEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def summary(events: list[HarmonyEvent]) -> list[tuple[str, str]]:
    """Events with ids replaced by their order and adjacent deltas joined: what a client
    would assemble, independent of how the output was split."""
    ids: dict[str, int] = {}
    out: list[tuple[str, str]] = []
    for event in events:
        if isinstance(event, TextDelta | ThinkingDelta):
            kind, text = type(event).__name__, event.text
        elif isinstance(event, ToolCallStart):
            kind, text = "start", f"{ids.setdefault(event.id, len(ids))}:{event.name}"
        elif isinstance(event, ToolInputDelta):
            kind, text = f"args{ids[event.id]}", event.partial_json
        else:
            kind, text = "call", f"{ids[event.id]}:{event.name}:{event.arguments}"
        if out and out[-1][0] == kind and kind != "start" and kind != "call":
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def check_invariants(events: list[HarmonyEvent]) -> None:
    """No markup in text or thinking; every call started, streamed and ended consistently."""
    args: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event, TextDelta | ThinkingDelta):
            assert event.text
            assert not any(m in event.text for m in MARKERS), event
        elif isinstance(event, ToolCallStart):
            assert event.id.startswith("toolu_") and event.id not in args
            args[event.id] = []
        elif isinstance(event, ToolInputDelta):
            args[event.id].append(event.partial_json)
        else:
            assert "".join(args.pop(event.id)) == event.arguments
            assert isinstance(json.loads(event.arguments), dict)
    assert not args, "a call started and never ended"


def calls(events: list[HarmonyEvent]) -> list[tuple[str, Any]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEvent)]


def text(events: list[HarmonyEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def thinking(events: list[HarmonyEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ThinkingDelta))


# --- the parser ---------------------------------------------------------------------------


def test_the_templates_own_call_turn_is_one_call() -> None:
    events = parse([FACTS["tool_call"]["assistant_turn_as_rendered"]])
    check_invariants(events)
    example = FACTS["tool_call"]["example"]
    assert calls(events) == [(example["name"], example["arguments"])]
    assert [type(e) for e in events] == [ToolCallStart, ToolInputDelta, ToolCallEvent]


def test_analysis_is_thinking_and_final_is_text() -> None:
    events = parse([OUTPUTS[1]])
    assert summary(events) == [("ThinkingDelta", "The user wants 4."), ("TextDelta", "It is 4.")]


def test_a_preamble_is_text_before_the_call() -> None:
    events = parse([OUTPUTS[2]])
    check_invariants(events)
    assert text(events) == "Listing files."
    assert calls(events) == [("Bash", {"command": "ls -la", "timeout": 5})]
    assert isinstance(events[0], TextDelta)


@pytest.mark.parametrize("start", ["", "<|start|>assistant", "<|start|>assistant "])
def test_the_first_header_may_repeat_the_prompts_start(start: str) -> None:
    assert calls(parse([start + CALL])) == [("Bash", {"command": "ls -la", "timeout": 5})]


def test_output_without_a_header_is_final_text() -> None:
    assert summary(parse(["Just an answer, no header."])) == [
        ("TextDelta", "Just an answer, no header.")
    ]
    assert text(parse(["to be or not"])) == "to be or not"  # looks like ` to=` for a while


@pytest.mark.parametrize("output", OUTPUTS)
def test_any_split_of_the_output_gives_the_same_events(output: str) -> None:
    whole = summary(parse([output]))
    assert whole
    for pieces in splits(output):
        events = parse(pieces)
        check_invariants(events)
        assert summary(events) == whole, pieces


def test_arguments_stream_before_the_call_ends() -> None:
    parser = HarmonyParser(config())
    header = "<|channel|>commentary to=functions.Bash <|constrain|>json<|message|>"
    assert parser.feed(header) == []
    started = parser.feed("{")
    assert [type(e) for e in started] == [ToolCallStart, ToolInputDelta]
    assert isinstance(started[0], ToolCallStart) and started[0].name == "Bash"
    streamed = [parser.feed(c) for c in '"command": "echo hello world"']
    pieces = [e for batch in streamed for e in batch]
    assert all(isinstance(e, ToolInputDelta) for e in pieces)
    # The key waits for its value; then the string goes out as it comes.
    assert "".join(e.partial_json for e in pieces if isinstance(e, ToolInputDelta)) == (
        '"command": "echo hello world"'
    )
    assert len(pieces) > 10
    end = parser.feed("}")
    assert [type(e) for e in end] == [ToolInputDelta, ToolCallEvent]
    assert parser.finish() == []


@pytest.mark.parametrize("cut", range(1, 36))
def test_a_cut_off_call_is_repaired(cut: int) -> None:
    body = '{"command": "ls -la", "timeout": 5}'
    events = parse([CALL.removesuffix(body) + body[:cut]])
    check_invariants(events)  # the arguments parse, and equal the streamed pieces
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    assert call.name == "Bash"
    # What was written (a safe prefix of it), then only closers.
    kept = 0
    while kept < min(cut, len(call.arguments)) and call.arguments[kept] == body[kept]:
        kept += 1
    assert set(call.arguments[kept:]) <= set('"}')


def test_a_truncated_string_keeps_what_was_written() -> None:
    events = parse(['<|channel|>commentary to=functions.Bash<|message|>{"command": "ls -la sr'])
    check_invariants(events)
    assert calls(events) == [("Bash", {"command": "ls -la sr"})]


def test_a_stop_sequence_ends_the_final_text_only() -> None:
    output = (
        "<|channel|>analysis<|message|>say STOP later<|end|><|start|>assistant"
        "<|channel|>final<|message|>Answer: STOP and more"
    )
    for pieces in splits(output):
        parser = HarmonyParser(config(stop_sequences=["STOP"]))
        events = [e for piece in pieces for e in parser.feed(piece)]
        assert parser.stopped and parser.stopped_by == "STOP" and parser.done
        events += parser.finish()
        assert thinking(events) == "say STOP later"
        assert text(events) == "Answer: "  # the text before the stop, its whitespace kept


def test_stop_sequences_do_not_apply_inside_arguments() -> None:
    events = parse([CALL.replace("ls -la", "STOP")], stop_sequences=["STOP"])
    assert calls(events) == [("Bash", {"command": "STOP", "timeout": 5})]


def test_without_parallel_calls_the_first_call_ends_the_turn() -> None:
    second = (
        '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"city": "x"}'
    )
    parser = HarmonyParser(config(max_tool_calls=1))
    events = parser.feed(CALL + "<|call|>")
    assert parser.tool_limit_reached and parser.done and parser.tool_calls_emitted == 1
    assert parser.feed(second) == [] and parser.finish() == []
    assert calls(events) == [("Bash", {"command": "ls -la", "timeout": 5})]
    both = parse([CALL + "<|call|>" + second])
    assert [name for name, _ in calls(both)] == ["Bash", "get_weather"]


def test_with_tools_disabled_a_call_is_text() -> None:
    events = parse([CALL], tools_enabled=False)
    assert summary(events) == [("TextDelta", '{"command": "ls -la", "timeout": 5}')]


def test_only_functions_are_the_clients_tools() -> None:
    events = parse(['<|channel|>commentary to=browser.search<|message|>{"query": "mlx"}'])
    assert summary(events) == [("TextDelta", '{"query": "mlx"}')]


def test_a_body_that_is_not_an_object_is_text() -> None:
    events = parse(["<|channel|>commentary to=functions.Bash<|message|>  ls -la"])
    assert summary(events) == [("TextDelta", "  ls -la")]  # indentation is text


def test_json_after_the_object_is_dropped() -> None:
    events = parse([CALL + " trailing junk"])
    check_invariants(events)
    assert calls(events) == [("Bash", {"command": "ls -la", "timeout": 5})]
    assert text(events) == ""


def test_two_text_messages_are_separated_by_a_blank_line() -> None:
    output = (
        "<|channel|>commentary<|message|>First.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Second."
    )
    assert text(parse([output])) == "First.\n\nSecond."


def test_whitespace_is_trimmed_per_message() -> None:
    assert summary(parse([OUTPUTS[5]])) == [("TextDelta", "  indented\n\nsecond")]
    assert parse(["<|channel|>final<|message|> \n\n "]) == []
    assert thinking(parse(["<|channel|>analysis<|message|>\n  deep  \n<|end|>"])) == "deep"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("<|channel|>bogus<|message|>hi", "bogus hi"),
        ("<|start|>assistant Hello world<|end|>", "Hello world"),
        ("<|start|>assistant\nHello", "Hello"),
        ("<|message|>hi<|end|><|end|>", "hi"),
        ("<|channel|>final<|message|>a<|message|>b", "a b"),
        ("<|channel|><|message|>x", "x"),
        ("<|channel|>final", ""),  # a header cut off by the end: markup, dropped
        ("to", "to"),
    ],
)
def test_malformed_markup_becomes_text_without_markers(output: str, expected: str) -> None:
    for pieces in splits(output):
        events = parse(pieces)
        check_invariants(events)
        assert text(events) == expected, pieces


def test_random_markup_never_leaks_raises_or_depends_on_the_split() -> None:
    rng = random.Random(7)
    words = [*MARKERS, "<|", "analysis", "final", "commentary", " to=functions.Bash", " to=python"]
    words += [" json", "{", "}", '"a"', ": ", "1", ",", " ", "\n", "hello", "STOP", "assistant"]
    words += ["to", "=", "[", '"', "\\"]
    for _ in range(600):
        output = "".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        options = {"stop_sequences": ["STOP"], "max_tool_calls": rng.choice([None, 1])}
        whole = parse([output], **options)
        check_invariants(whole)
        cut = rng.randint(0, len(output))
        for pieces in (list(output), [output[:cut], output[cut:]]):
            events = parse(pieces, **options)
            check_invariants(events)
            assert summary(events) == summary(whole), (output, pieces)


# --- the grammar (a gpt-oss test model: its tokenizer and special tokens) -----------------


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, TokenizerWrapper]:
    from mlxlaunch.testing.builder import build_model
    from mlxlaunch.testing.templates import real_template_family

    path = build_model(
        tmp_path_factory.mktemp("gpt-oss"), "tiny", template=real_template_family(TEMPLATE)
    )
    loaded = mlx_lm.load(str(path))
    return loaded[0], loaded[1]


def accepts(tokenizer: TokenizerWrapper, constraint: Any, output: str) -> bool:
    matcher = constraint.compiled.template.deep_copy()
    ids = tokenizer.encode(output, add_special_tokens=False)
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


@pytest.mark.slow
def test_forced_call_grammar_accepts_harmony_calls(gpt_oss: tuple[Any, Any]) -> None:
    _, tokenizer = gpt_oss
    constraint = harmony_tool_constraint(tokenizer, TOOLS, ToolChoice("tool", "Bash"))
    assert constraint is not None
    call = CALL + "<|call|>"
    assert accepts(tokenizer, constraint, call)
    assert accepts(
        tokenizer, constraint, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant" + call
    )
    history = ' to=functions.Bash<|channel|>commentary json<|message|>{"command": "ls"}<|call|>'
    assert accepts(tokenizer, constraint, history)  # the form the template renders
    assert not accepts(tokenizer, constraint, CALL.replace("ls -la", "far too long a command"))
    assert not accepts(tokenizer, constraint, "<|channel|>final<|message|>No.")
    no_analysis = harmony_tool_constraint(tokenizer, TOOLS, ToolChoice("any"), analysis=False)
    assert no_analysis is not None
    assert not accepts(
        tokenizer, no_analysis, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant" + call
    )


@pytest.mark.slow
@pytest.mark.parametrize("choice", [ToolChoice("any"), ToolChoice("tool", "get_weather")])
def test_forced_calls_parse_back_and_match_the_schema(
    gpt_oss: tuple[Any, Any], choice: ToolChoice
) -> None:
    from test_constrain import generate

    model, tokenizer = gpt_oss
    constraint = harmony_tool_constraint(tokenizer, TOOLS, choice, analysis=False)
    assert constraint is not None
    processors = [constraint.logits_processor() for _ in range(8)]
    schemas = {t.name: {k: v for k, v in t.parameters.items() if k != "$schema"} for t in TOOLS}
    for (tokens, reason), processor in zip(
        generate(model, tokenizer, processors, max_tokens=120, seed=3), processors, strict=True
    ):
        assert reason == "stop" and processor.error is None and processor.complete
        output = tokenizer.decode(tokens)
        events = parse([output], calls_forced=True)  # the EOS (<|call|>) is not fed
        check_invariants(events)
        ((name, arguments),) = calls(events)
        assert choice.mode == "any" or name == choice.name
        jsonschema.validate(arguments, schemas[name])
        assert text(events) == ""


@pytest.mark.slow
def test_strict_auto_allows_an_answer_or_a_valid_call(gpt_oss: tuple[Any, Any]) -> None:
    _, tokenizer = gpt_oss
    strict = [ToolSpec(BASH.name, BASH.description, BASH.parameters, strict=True), WEATHER]
    constraint = harmony_tool_constraint(tokenizer, strict, ToolChoice("auto"))
    assert constraint is not None
    assert accepts(tokenizer, constraint, "<|channel|>final<|message|>Hello.")
    assert accepts(
        tokenizer,
        constraint,
        "<|channel|>commentary<|message|>Go.<|end|><|start|>assistant" + CALL + "<|call|>",
    )
    weather = CALL.replace("Bash", "get_weather").replace('"command"', '"x"') + "<|call|>"
    assert accepts(tokenizer, constraint, weather)  # not strict: any object
    assert not accepts(tokenizer, constraint, CALL.replace('"command"', '"cmd"') + "<|call|>")


@pytest.mark.slow
def test_no_constraint_or_a_clear_refusal(gpt_oss: tuple[Any, Any]) -> None:
    _, tokenizer = gpt_oss
    assert harmony_tool_constraint(tokenizer, TOOLS, ToolChoice("auto")) is None
    assert harmony_tool_constraint(tokenizer, TOOLS, ToolChoice("none")) is None
    with pytest.raises(InvalidRequest, match="not offered"):
        harmony_tool_constraint(tokenizer, TOOLS, ToolChoice("tool", "Read"))
    with pytest.raises(InvalidRequest, match="at least one tool"):
        harmony_tool_constraint(tokenizer, [], ToolChoice("any"))


@pytest.mark.slow
def test_a_response_schema_is_a_final_message(gpt_oss: tuple[Any, Any]) -> None:
    _, tokenizer = gpt_oss
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    constraint = harmony_schema_constraint(tokenizer, schema)
    answer = '<|channel|>final<|message|>{"title": "Fix the bug"}'
    assert accepts(tokenizer, constraint, answer)
    assert accepts(
        tokenizer, constraint, "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant" + answer
    )
    assert not accepts(tokenizer, constraint, '{"title": "Fix the bug"}')
    assert text(parse([answer])) == '{"title": "Fix the bug"}'
    with pytest.raises(InvalidRequest):
        harmony_schema_constraint(tokenizer, "not a schema")  # type: ignore[arg-type]
