"""Tool-call markup of each model family, parsed by mlx-lm's own parser modules.

Every family's realistic output is fed in every two-piece split and one character at a time;
the call must come out whole and no markup may leak as text.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Sequence
from types import ModuleType

import pytest
from parser_helpers import splits

from mlxlaunch.engine.output.parser import OutputParser, ParsedEvent, ParserConfig
from mlxlaunch.engine.types import TextDelta, ToolCallEvent, ToolSpec

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather forecast for a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
PARIS = ("get_weather", {"city": "Paris", "days": 3})
PARIS_CALL = ("tool", PARIS)

# family module -> (tool-call markup as the model writes it, calls it holds)
FAMILIES: dict[str, tuple[str, list[tuple[str, dict[str, object]]]]] = {
    "json_tools": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        "</tool_call>",
        [PARIS],
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        [PARIS],
    ),
    "mistral": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', [PARIS]),
    "glm47": (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        [PARIS],
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_weather:1"
        '<|tool_call_argument_begin|>{"city": "Lyon"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        [PARIS, ("get_weather", {"city": "Lyon"})],
    ),
    "gemma4": ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>', [PARIS]),
    "function_gemma": (
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:3}"
        "<end_function_call>",
        [PARIS],
    ),
    "pythonic": (
        '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>',
        [PARIS],
    ),
    "minimax_m2": (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
        [PARIS],
    ),
    "longcat": (
        "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
        "<longcat_arg_value>Paris</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>\n"
        "<longcat_arg_value>3</longcat_arg_value>\n</longcat_tool_call>",
        [PARIS],
    ),
    "minicpm5": (
        '<function name="get_weather"><param name="city">Paris</param>'
        '<param name="days">3</param></function>',
        [PARIS],
    ),
    "kimi_k3": (
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
        [PARIS],
    ),
    "muse_spark": (
        '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter name="city">'
        'Paris</atem:parameter><atem:parameter name="days">3</atem:parameter></atem:invoke>'
        "</atem:function_calls>",
        [PARIS],
    ),
}


def run(config: ParserConfig, pieces: Iterable[str]) -> tuple[list[ParsedEvent], OutputParser]:
    parser = OutputParser(config)
    events = [event for piece in pieces for event in parser.feed(piece)]
    return events + parser.finish(), parser


def summarise(events: Sequence[ParsedEvent]) -> list[tuple[str, object]]:
    """Merge adjacent deltas of one kind; tool calls as (name, arguments object)."""
    out: list[tuple[str, object]] = []
    for event in events:
        if isinstance(event, ToolCallEvent):
            out.append(("tool", (event.name, json.loads(event.arguments))))
        else:
            kind = "text" if isinstance(event, TextDelta) else "thinking"
            if out and out[-1][0] == kind:
                out[-1] = (kind, str(out[-1][1]) + event.text)
            else:
                out.append((kind, event.text))
    return out


def family(name: str) -> ModuleType:
    return importlib.import_module(f"mlx_lm.tool_parsers.{name}")


def family_config(name: str, **overrides: object) -> ParserConfig:
    module = family(name)
    config = ParserConfig(
        think_start="<think>",
        think_end="</think>",
        tool_call_start=module.tool_call_start,
        tool_call_end=module.tool_call_end,
        tool_parser=module.parse_tool_call,
        tools=[WEATHER],
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_call_in_every_split(name: str) -> None:
    markup, calls = FAMILIES[name]
    output = "<think>\nThe user wants the weather.\n</think>\n\nLet me look that up.\n\n" + markup
    expected = [
        ("thinking", "The user wants the weather."),
        ("text", "Let me look that up."),
        *[("tool", call) for call in calls],
    ]
    config = family_config(name)
    for pieces in splits(output):
        events, _ = run(config, pieces)
        assert summarise(events) == expected, pieces
        for event in events:
            if isinstance(event, ToolCallEvent):
                assert json.loads(event.arguments) is not None and event.id.startswith("toolu_")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_markup_is_text_when_tools_are_off(name: str) -> None:
    markup, _ = FAMILIES[name]
    events, _ = run(family_config(name, tools_enabled=False), list("Sure: " + markup))
    assert summarise(events) == [("text", "Sure: " + markup)]


@pytest.mark.parametrize("name", sorted(n for n in FAMILIES if family(n).tool_call_end))
def test_family_truncated_call_is_text(name: str) -> None:
    markup, _ = FAMILIES[name]
    truncated = markup[: len(markup) * 2 // 3]
    events, _ = run(family_config(name), list(truncated))
    assert summarise(events) == [("text", truncated.rstrip())]  # trailing space: trimmed


def test_mistral_calls_run_to_the_end_and_are_parsed_at_finish() -> None:
    output = (
        'I will check both.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}'
    )
    parser = OutputParser(family_config("mistral"))
    streamed = [event for char in output for event in parser.feed(char)]
    assert summarise(streamed) == [("text", "I will check both.")]  # nothing of the calls yet
    assert summarise(parser.finish()) == [PARIS_CALL, ("tool", ("get_weather", {"city": "Nice"}))]


def test_mistral_truncated_call_is_text() -> None:
    output = '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa'
    events, _ = run(family_config("mistral"), [output])
    assert summarise(events) == [("text", output)]


def test_gemma4_thinking_channel_and_call() -> None:
    markup, _ = FAMILIES["gemma4"]
    output = "<|channel>thought\nCheck the weather.<channel|>" + markup
    config = family_config("gemma4", think_start="<|channel>thought", think_end="<channel|>")
    for pieces in splits(output):
        assert summarise(run(config, pieces)[0]) == [
            ("thinking", "Check the weather."),
            PARIS_CALL,
        ]


def test_qwen3_coder_max_one_call() -> None:
    markup, _ = FAMILIES["qwen3_coder"]
    parser = OutputParser(family_config("qwen3_coder", max_tool_calls=1))
    events = parser.feed(markup + "\n" + markup)
    assert summarise(events) == [PARIS_CALL]
    assert parser.tool_limit_reached


def test_kimi_section_with_two_calls_and_a_limit_of_one() -> None:
    markup, _ = FAMILIES["kimi_k2"]
    events, parser = run(family_config("kimi_k2", max_tool_calls=1), [markup])
    assert summarise(events) == [PARIS_CALL]
    assert parser.done
