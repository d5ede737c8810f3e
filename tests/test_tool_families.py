"""A tool call in every supported syntax family, end to end: scripted tokens from a tiny model
whose chat template makes mlx-lm infer that family's parser, through the real engine, output
parser, server and the official SDK's stream accumulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import pytest
from engine_helpers import Served, messages_tool, serve

from mlxlaunch.engine.decoding.tool_grammar import supported_families
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import TEMPLATE_FAMILIES

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

WEATHER_TOOL = messages_tool(
    "get_weather",
    "Weather forecast for a city",
    {"city": {"type": "string"}, "days": {"type": "integer"}},
    required=["city"],
)
ARGUMENTS = {"city": "Paris", "days": 3}

# family -> the tool call as that family's models write it (arguments = ARGUMENTS)
MARKUP: dict[str, str] = {
    "qwen": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
    "</tool_call>",
    # Qwen's template with the vision tokens (tiny-vision): the same calls.
    "qwen_vl": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
    "</tool_call>",
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    "glm47": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
    "<|tool_calls_section_end|>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:3}"
    "<end_function_call>",
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>',
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
    '</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
    "longcat": "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
    "<longcat_arg_value>Paris</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>\n"
    "<longcat_arg_value>3</longcat_arg_value>\n</longcat_tool_call>",
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param>'
    '<param name="days">3</param></function>',
    "muse_spark": '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter '
    'name="city">Paris</atem:parameter><atem:parameter name="days">3</atem:parameter>'
    "</atem:invoke></atem:function_calls>",
}
# Families whose calls have no end marker run to the end of the output: no text after them.
NO_END_MARKER = {"mistral"}
BEFORE, AFTER = "Let me look that up.", "Done looking."


def test_every_template_family_has_a_scripted_call() -> None:
    assert set(MARKUP) == set(TEMPLATE_FAMILIES)


@dataclass(kw_only=True)
class FamilyServer(Served):
    """A served tiny model with the chat template of `family`."""

    family: str


@pytest.fixture(scope="module", params=sorted(MARKUP))
def family_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyServer]:
    family = str(request.param)
    model_dir = build_model(tmp_path_factory.mktemp(family), "tiny", template=family)
    with serve(Path(model_dir), max_concurrency=2) as s:
        served = FamilyServer(s.engine, s.server, s.scripted, None, Path(model_dir), family=family)
        parser = served.tokenizer.tool_parser
        assert parser is not None
        assert parser.__module__.rsplit(".", 1)[-1] == TEMPLATE_FAMILIES[family].tool_parser
        yield served


def split_tokens(tokenizer: Any, text: str) -> list[int]:
    """`text` encoded one character at a time: every marker arrives in pieces."""
    return [t for char in text for t in tokenizer.encode(char, add_special_tokens=False)]


def _reply(family: str) -> tuple[str, list[str]]:
    """The scripted output and the block types it must produce."""
    if family in NO_END_MARKER:
        return f"{BEFORE}\n\n{MARKUP[family]}", ["text", "tool_use"]
    return f"{BEFORE}\n\n{MARKUP[family]}\n\n{AFTER}", ["text", "tool_use", "text"]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_tool_call_streams_as_a_tool_use_block(family_server: FamilyServer, split: bool) -> None:
    text, kinds = _reply(family_server.family)
    if split:
        family_server.scripted.enqueue(tokens=split_tokens(family_server.tokenizer, text))
    else:
        family_server.scripted.enqueue(text)
    kwargs: dict[str, Any] = {
        "model": "local",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    }
    with family_server.client.messages.stream(**kwargs) as stream:
        deltas = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == kinds
    call = final.content[1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == ARGUMENTS and call.id.startswith("toolu_")
    assert final.stop_reason == "tool_use"
    first = final.content[0]
    assert first.type == "text" and first.text == BEFORE
    if len(kinds) == 3:
        last = final.content[2]
        assert last.type == "text" and last.text == AFTER
    # No markup leaks: the visible text is exactly the prose around the call.
    streamed_text = "".join(getattr(d.delta, "text", "") for d in deltas)
    assert streamed_text == BEFORE + (AFTER if len(kinds) == 3 else "")
    pieces = "".join(getattr(d.delta, "partial_json", "") for d in deltas)
    assert json.loads(pieces) == ARGUMENTS

    # The non-streaming path builds the same content from the same tokens.
    family_server.scripted.enqueue(text)
    message = family_server.client.messages.create(**kwargs)
    assert [b.type for b in message.content] == kinds
    assert message.content[1].input == ARGUMENTS
    assert message.stop_reason == "tool_use"


def test_markup_is_text_when_tool_choice_is_none(family_server: FamilyServer) -> None:
    markup = MARKUP[family_server.family]
    family_server.scripted.enqueue(markup)
    message = family_server.client.messages.create(
        model="local",
        max_tokens=400,
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == markup.strip()
    assert message.stop_reason == "end_turn"


BOUNDED_TOOL = messages_tool(
    "get_weather",
    "Weather forecast for a city",
    {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    closed=True,
)


def test_forced_tool_choice_in_the_family_syntax(family_server: FamilyServer) -> None:
    """The random model (no script) under tool_choice any: a call in the family's own markup,
    read back by its parser; families without a call grammar refuse with a 400."""
    kwargs: dict[str, Any] = {
        "model": "local",
        "max_tokens": 120,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [BOUNDED_TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    if TEMPLATE_FAMILIES[family_server.family].tool_parser not in supported_families():
        with pytest.raises(anthropic.BadRequestError, match="cannot force tool calls"):
            family_server.client.messages.create(**kwargs)
        return
    for _ in range(3):
        message = family_server.client.messages.create(**kwargs)
        assert message.stop_reason == "tool_use", message
        (call,) = message.content
        assert call.type == "tool_use" and call.name == "get_weather"
        jsonschema.validate(call.input, BOUNDED_TOOL["input_schema"])


def test_history_tool_calls_render_in_the_family_syntax(family_server: FamilyServer) -> None:
    """An assistant tool call in the history renders as markup the family's parser reads back."""
    tokenizer = family_server.tokenizer
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": WEATHER_TOOL["input_schema"]["properties"],
                },
            },
        }
    ]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "w?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ],
        tools=tools,
        tokenize=False,
    )
    body = text.rsplit(tokenizer.tool_call_start, 1)[1].split("<|im_end|>", 1)[0]
    if tokenizer.tool_call_end:
        body = body.split(tokenizer.tool_call_end, 1)[0]
    parsed = tokenizer.tool_parser(body, tools)
    parsed = parsed if isinstance(parsed, list) else [parsed]
    assert [(p["name"], p["arguments"]) for p in parsed] == [("get_weather", ARGUMENTS)]
