"""The streaming output parser: thinking spans, tool calls, stop sequences, whitespace, splits.

Output is fed in every split we can think of (every two-piece split, one character at a time,
random splits from hypothesis); the events must not depend on the split.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from mlx_lm.tool_parsers import json_tools
from parser_helpers import splits

from mlxlaunch.engine.output.parser import OutputParser, ParsedEvent, ParserConfig
from mlxlaunch.engine.types import TextDelta, ThinkingDelta, ToolCallEvent, ToolSpec

Summary = list[tuple[str, object]]

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def qwen_config(**overrides: object) -> ParserConfig:
    """A Qwen3-style model: <think> spans and Hermes JSON tool calls."""
    config = ParserConfig(
        think_start="<think>",
        think_end="</think>",
        tool_call_start=json_tools.tool_call_start,
        tool_call_end=json_tools.tool_call_end,
        tool_parser=json_tools.parse_tool_call,
        tools=[WEATHER],
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def call_markup(name: str, arguments: dict[str, object]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def run(config: ParserConfig, pieces: Iterable[str]) -> tuple[list[ParsedEvent], OutputParser]:
    parser = OutputParser(config)
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return events, parser


def summarise(events: Sequence[ParsedEvent]) -> Summary:
    """Merge adjacent deltas of one kind; tool calls as (name, arguments object)."""
    out: Summary = []
    for event in events:
        if isinstance(event, ToolCallEvent):
            out.append(("tool", (event.name, json.loads(event.arguments))))
            continue
        kind = "text" if isinstance(event, TextDelta) else "thinking"
        assert event.text, "empty delta"
        if out and out[-1][0] == kind:
            out[-1] = (kind, str(out[-1][1]) + event.text)
        else:
            out.append((kind, event.text))
    return out


def summary_for_every_split(config: ParserConfig, output: str) -> Summary:
    results = [summarise(run(config, pieces)[0]) for pieces in splits(output)]
    assert all(result == results[0] for result in results), "events depend on the split"
    return results[0]


# --- thinking -----------------------------------------------------------------------------


def test_thinking_span_becomes_thinking_and_is_trimmed() -> None:
    output = "<think>\nThe user wants a greeting.\n</think>\n\nHello there!"
    assert summary_for_every_split(qwen_config(), output) == [
        ("thinking", "The user wants a greeting."),
        ("text", "Hello there!"),
    ]


def test_prompt_opened_thinking() -> None:
    output = "Let me think.\n\nStill thinking.\n</think>\n\nDone."
    assert summary_for_every_split(qwen_config(start_in_thinking=True), output) == [
        ("thinking", "Let me think.\n\nStill thinking."),
        ("text", "Done."),
    ]


def test_split_marker_never_leaks() -> None:
    parser = OutputParser(qwen_config())
    assert parser.feed("<thi") == []
    assert parser.feed("nk>") == []
    assert parser.feed("plan") == [ThinkingDelta("plan")]
    assert parser.feed("</th") == []
    assert parser.feed("ink>Hi") == [TextDelta("Hi")]


def test_failed_marker_prefix_is_released_at_once() -> None:
    parser = OutputParser(qwen_config())
    assert parser.feed("a <th") == [TextDelta("a")]
    assert parser.feed("x") == [TextDelta(" <thx")]


def test_unterminated_thinking_is_flushed_as_thinking() -> None:
    events, _ = run(qwen_config(), ["<think>\nstill going\n\n"])
    assert summarise(events) == [("thinking", "still going")]


def test_held_marker_prefix_is_released_at_finish() -> None:
    events, _ = run(qwen_config(), ["The tag is <thi"])
    assert summarise(events) == [("text", "The tag is <thi")]


def test_stray_markers_are_dropped() -> None:
    output = "<think>a<think>b</think>c</think>d"
    assert summary_for_every_split(qwen_config(), output) == [
        ("thinking", "ab"),
        ("text", "cd"),
    ]


def test_empty_thinking_span_produces_no_event() -> None:
    assert summary_for_every_split(qwen_config(), "<think>\n\n</think>\n\nAnswer") == [
        ("text", "Answer")
    ]


def test_model_without_thinking_syntax_keeps_tags_as_text() -> None:
    config = ParserConfig()
    assert summarise(run(config, ["<think>x</think>"])[0]) == [("text", "<think>x</think>")]


# --- whitespace ---------------------------------------------------------------------------


def test_leading_blank_lines_go_but_indentation_stays() -> None:
    assert summary_for_every_split(qwen_config(), "\n\n    indented\n") == [
        ("text", "    indented")
    ]


def test_inner_whitespace_is_kept_and_streamed() -> None:
    parser = OutputParser(qwen_config())
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(" ") == []  # held: it might be the last thing before a tool call
    assert parser.feed("\n\nworld") == [TextDelta(" \n\nworld")]


# --- tool calls ---------------------------------------------------------------------------


def test_tool_call_event() -> None:
    output = "Let me check.\n\n" + call_markup("get_weather", {"city": "Paris"})
    events, parser = run(qwen_config(), [output])
    assert summarise(events) == [
        ("text", "Let me check."),
        ("tool", ("get_weather", {"city": "Paris"})),
    ]
    call = events[-1]
    assert isinstance(call, ToolCallEvent)
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", call.id)
    assert summary_for_every_split(qwen_config(), output) == summarise(events)
    assert not parser.done


def test_tool_call_ids_are_unique() -> None:
    output = call_markup("get_weather", {"city": "A"}) + call_markup("get_weather", {"city": "B"})
    events, _ = run(qwen_config(), [output])
    ids = [e.id for e in events if isinstance(e, ToolCallEvent)]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_whitespace_only_text_before_and_between_calls_is_not_emitted() -> None:
    output = (
        "\n\n"
        + call_markup("get_weather", {"city": "A"})
        + "\n"
        + call_markup("get_weather", {"city": "B"})
        + "\n"
    )
    assert summary_for_every_split(qwen_config(), output) == [
        ("tool", ("get_weather", {"city": "A"})),
        ("tool", ("get_weather", {"city": "B"})),
    ]


def test_thinking_then_call() -> None:
    output = "<think>\nNeed weather.\n</think>\n\n" + call_markup("get_weather", {"city": "Oslo"})
    assert summary_for_every_split(qwen_config(), output) == [
        ("thinking", "Need weather."),
        ("tool", ("get_weather", {"city": "Oslo"})),
    ]


def test_call_opened_inside_thinking_ends_the_thinking() -> None:
    output = "<think>\nNeed weather.\n" + call_markup("get_weather", {"city": "Oslo"}) + "</think>"
    assert summary_for_every_split(qwen_config(), output) == [
        ("thinking", "Need weather."),
        ("tool", ("get_weather", {"city": "Oslo"})),
    ]


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"',  # truncated JSON
        '{"arguments": {"city": "Paris"}}',  # no name
        '{"name": "get_weather", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "get_weather", "arguments": "not json"}',
        "",
    ],
)
def test_malformed_call_comes_back_as_text(body: str) -> None:
    output = "Before <tool_call>" + body + "</tool_call> after"
    assert summary_for_every_split(qwen_config(), output) == [("text", output)]


def test_call_left_open_at_the_end_comes_back_as_text() -> None:
    output = 'Try <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    assert summary_for_every_split(qwen_config(), output) == [("text", output)]


def test_a_forced_call_cut_off_at_the_end_is_dropped() -> None:
    # Under tool_choice any/tool the output is constrained to calls: the one max_tokens cut
    # off is not text anyone wrote, and the calls before it stand.
    output = call_markup("get_weather", {"city": "A"}) + '\n<tool_call>\n{"name": "get_wea'
    assert summary_for_every_split(qwen_config(calls_forced=True), output) == [
        ("tool", ("get_weather", {"city": "A"})),
    ]


def test_arguments_as_json_string_and_parameters_key_are_normalised() -> None:
    output = (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'
        '<tool_call>{"name": "get_weather", "parameters": {"city": "Bern"}}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call>'
    )
    assert summarise(run(qwen_config(), [output])[0]) == [
        ("tool", ("get_weather", {"city": "Rome"})),
        ("tool", ("get_weather", {"city": "Bern"})),
        ("tool", ("now", {})),
    ]


def test_tools_disabled_returns_markup_verbatim() -> None:
    output = "Sure. " + call_markup("get_weather", {"city": "Paris"})
    config = qwen_config(tools_enabled=False)
    assert summary_for_every_split(config, output) == [("text", output)]


def test_unknown_tool_name_is_still_emitted() -> None:
    events, _ = run(qwen_config(), [call_markup("no_such_tool", {"x": 1})])
    assert summarise(events) == [("tool", ("no_such_tool", {"x": 1}))]


def test_max_tool_calls_stops_after_the_limit() -> None:
    output = (
        call_markup("get_weather", {"city": "A"})
        + "\n"
        + call_markup("get_weather", {"city": "B"})
        + "more"
    )
    parser = OutputParser(qwen_config(max_tool_calls=1))
    events: list[ParsedEvent] = []
    for char in output:
        events += parser.feed(char)
        if parser.done:
            break
    assert parser.tool_limit_reached and parser.done and not parser.stopped
    assert summarise(events) == [("tool", ("get_weather", {"city": "A"}))]
    assert parser.feed("x") == [] and parser.finish() == []


def test_max_tool_calls_must_be_positive() -> None:
    with pytest.raises(ValueError):
        OutputParser(qwen_config(max_tool_calls=0))


# --- stop sequences -----------------------------------------------------------------------


def test_stop_sequence_ends_the_text() -> None:
    config = qwen_config(stop_sequences=["###"])
    for pieces in splits("Alpha beta ### gamma"):
        events, parser = run(config, pieces)
        assert summarise(events) == [("text", "Alpha beta ")]
        assert parser.stopped and parser.stopped_by == "###" and parser.done


def test_stop_prefix_is_held_then_released() -> None:
    parser = OutputParser(qwen_config(stop_sequences=["STOP"]))
    assert parser.feed("go ST") == [TextDelta("go")]
    assert parser.feed("ART") == [TextDelta(" START")]
    assert parser.feed("x ST") == [TextDelta("x")]
    assert parser.finish() == [TextDelta(" ST")]
    assert not parser.stopped


def test_earliest_completing_stop_wins() -> None:
    config = qwen_config(stop_sequences=["abcd", "bc"])
    for pieces in splits("xxabcd"):
        events, parser = run(config, pieces)
        assert summarise(events) == [("text", "xxa")]
        assert parser.stopped_by == "bc"


def test_stop_before_a_tool_call_suppresses_it() -> None:
    output = "Checking STOP " + call_markup("get_weather", {"city": "Paris"})
    events, parser = run(qwen_config(stop_sequences=["STOP"]), [output])
    assert summarise(events) == [("text", "Checking ")]
    assert parser.stopped_by == "STOP"


def test_stop_sequences_do_not_apply_inside_thinking_or_tool_calls() -> None:
    output = "<think>STOP here?</think>" + call_markup("get_weather", {"city": "STOP"}) + "ok STOP"
    config = qwen_config(stop_sequences=["STOP"])
    assert summary_for_every_split(config, output) == [
        ("thinking", "STOP here?"),
        ("tool", ("get_weather", {"city": "STOP"})),
        ("text", "ok "),
    ]


def test_stop_sequence_equal_to_a_marker_stops() -> None:
    config = qwen_config(stop_sequences=["<tool_call>"])
    events, parser = run(config, ["Hi " + call_markup("get_weather", {"city": "X"})])
    assert summarise(events) == [("text", "Hi ")] and parser.stopped


# --- cost ---------------------------------------------------------------------------------


def test_buffer_stays_short_while_streaming() -> None:
    """O(piece) per feed: the unclassified buffer never grows with the output."""
    config = qwen_config(stop_sequences=["</answer>"])
    parser = OutputParser(config)
    longest = max(len(m) for m in ["</answer>", "<tool_call>", "</tool_call>", "</think>"])
    chunk = "<think>" + "reasoning < / > " * 2000 + "</think>" + "text <" * 2000
    chunk += "<tool_call>" + '{"name": "f", "arguments": {"a": "' + "x<" * 5000 + '"}}</tool_call>'
    for char in chunk:
        parser.feed(char)
        assert len(parser._buffer) < longest
    assert [e for e in parser.finish() if isinstance(e, ToolCallEvent)] == []


# --- random splits ------------------------------------------------------------------------

_word = st.text(alphabet="abcxyz.,!?<>/{}", min_size=1, max_size=6).filter(
    lambda w: "<think>" not in w and "</think>" not in w
)
_content = st.lists(_word, min_size=1, max_size=4).map(" ".join)
_segment = st.one_of(
    st.tuples(st.just("text"), _content),
    st.tuples(st.just("thinking"), _content),
    st.tuples(
        st.just("tool"),
        st.tuples(
            st.sampled_from(["get_weather", "Bash", "Read"]),
            st.dictionaries(st.sampled_from(["city", "x"]), _content | st.integers(), max_size=2),
        ),
    ),
)


def render(segments: list[tuple[str, object]]) -> tuple[str, Summary]:
    """Model output for the segments, and the events the parser must give for it."""
    output = ""
    expected: Summary = []
    for kind, value in segments:
        if kind == "text":
            output += f"{value}\n\n"
        elif kind == "thinking":
            output += f"<think>\n{value}\n</think>\n\n"
        else:
            assert isinstance(value, tuple)
            output += call_markup(*value) + "\n"
        if kind != "tool" and expected and expected[-1][0] == kind:
            # Two text runs merge; the whitespace between them stays.
            sep = "\n\n" if kind == "text" else ""
            expected[-1] = (kind, f"{expected[-1][1]}{sep}{value}")
        else:
            expected.append((kind, value))
    return output, expected


@settings(max_examples=examples(150), deadline=None)
@given(segments=st.lists(_segment, max_size=5), data=st.data())
def test_random_splits_give_the_expected_events(
    segments: list[tuple[str, object]], data: st.DataObject
) -> None:
    output, expected = render(segments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(output)), max_size=12)))
    pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)], strict=True)]
    assert summarise(run(qwen_config(), pieces)[0]) == expected


@settings(max_examples=examples(200), deadline=None)
@given(
    output=st.lists(
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<th",
                "</",
                "ST",
                "OP",
                "STOP",
                '{"name": "f", "arguments": {}}',
                "a",
                " ",
                "\n",
                "<",
                ">",
            ]
        ),
        max_size=14,
    ).map("".join),
    data=st.data(),
)
def test_arbitrary_output_is_split_invariant(output: str, data: st.DataObject) -> None:
    config = qwen_config(stop_sequences=["STOP", "OPS"])
    whole = summarise(run(config, [output])[0])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(output)), max_size=10)))
    pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)], strict=True)]
    assert summarise(run(config, pieces)[0]) == whole
    assert summarise(run(config, list(output))[0]) == whole
