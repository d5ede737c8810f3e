"""Families no table knows: the tool-call syntax is learned from what the template writes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jinja2
import pytest
from engine_helpers import serve

from mlxlaunch.engine.runtime.learned_syntax import (
    LearnedCallSyntax,
    learn_json_call_syntax,
    learn_think_markers,
)
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import TemplateFamily

# Phi-4-mini's shape: a JSON list of calls between its own tags.
PHI_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}<|system|>{{ m.content }}<|end|>"
    "{% elif m.role == 'user' %}<|user|>{{ m.content }}<|end|>"
    "{% elif m.role == 'assistant' %}<|assistant|>"
    "{% if m.tool_calls %}<|tool_call|>{{ m.tool_calls | map(attribute='function') | list"
    " | tojson }}<|/tool_call|>{% else %}{{ m.content }}{% endif %}<|end|>"
    "{% elif m.role == 'tool' %}<|tool_response|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if tools %}<|tool|>{{ tools | tojson }}<|/tool|>{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Granite's shape: one marker before the list, nothing after it but the turn's end.
GRANITE_LIKE = PHI_LIKE.replace("<|/tool_call|>", "")
# A bare JSON object as the whole reply, with "parameters".
BARE = PHI_LIKE.replace(
    "<|tool_call|>{{ m.tool_calls | map(attribute='function') | list | tojson }}<|/tool_call|>",
    '{"name": "{{ m.tool_calls[0].function.name }}", "parameters": '
    "{{ m.tool_calls[0].function.arguments | tojson }}}",
)
# Calls as XML this module cannot read: nothing is learned.
XML = PHI_LIKE.replace(
    "<|tool_call|>{{ m.tool_calls | map(attribute='function') | list | tojson }}<|/tool_call|>",
    "<call name='{{ m.tool_calls[0].function.name }}'>"
    "{% for k, v in m.tool_calls[0].function.arguments.items() %}<{{ k }}>{{ v }}</{{ k }}>"
    "{% endfor %}</call>",
)


def renderer(template: str) -> Any:
    compiled = jinja2.Environment().from_string(template)

    def render(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        return compiled.render(messages=messages, tools=tools, add_generation_prompt=generation)

    return render


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (PHI_LIKE, LearnedCallSyntax("<|tool_call|>", "<|/tool_call|>", "[")),
        (GRANITE_LIKE, LearnedCallSyntax("<|tool_call|>", "", "[")),
        (BARE, LearnedCallSyntax("", "", "{")),
    ],
    ids=["phi", "granite", "bare"],
)
def test_the_syntax_is_learned_from_the_template(
    template: str, expected: LearnedCallSyntax
) -> None:
    assert learn_json_call_syntax(renderer(template)) == expected


def test_markup_it_cannot_read_teaches_nothing() -> None:
    assert learn_json_call_syntax(renderer(XML)) is None
    assert learn_json_call_syntax(renderer("{{ messages[0].content }}")) is None


def test_a_template_that_refuses_the_probe_teaches_nothing() -> None:
    assert learn_json_call_syntax(renderer("{{ raise_exception('no') }}")) is None


WEATHER = {
    "name": "get_weather",
    "description": "Weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module", params=["phi", "granite"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    template = PHI_LIKE if request.param == "phi" else GRANITE_LIKE
    family = TemplateFamily(
        name=f"learned-{request.param}",
        template_file="inline.jinja",
        control_tokens=("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        markup_tokens=(
            "<|tool_call|>",
            "<|/tool_call|>",
            "<|tool|>",
            "<|/tool|>",
            "<|tool_response|>",
        ),
        eos_token="<|end|>",
        pad_token="<|endoftext|>",
        tool_parser=None,
        template_text=template,
    )
    model_dir = build_model(tmp_path_factory.mktemp(family.name), "tiny", template=family)
    with serve(model_dir) as served:
        yield request.param, served.scripted, served.server


@pytest.mark.slow
def test_a_learned_call_comes_back_as_tool_use(served: Any) -> None:
    name, scripted, server = served
    call = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    scripted.enqueue("Checking.\n" + call + ("<|/tool_call|>" if name == "phi" else ""))
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    message = client.messages.create(
        model="m",
        max_tokens=200,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Checking."  # type: ignore[union-attr]
    tool = message.content[1]
    assert tool.name == "get_weather" and tool.input == {"city": "Paris"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert json.dumps(tool.input)  # type: ignore[union-attr]
    # The result renders back through the same template and the next turn answers.
    scripted.enqueue("Sunny.")
    follow = client.messages.create(
        model="m",
        max_tokens=50,
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in message.content],
            },  # type: ignore[misc]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sun"}],
            },  # type: ignore[union-attr]
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert follow.content[0].text == "Sunny."  # type: ignore[union-attr]


# --- think markers (issue 35, item 10) ---------------------------------------------------------


def _thinking_template(start: str, end: str, field: str = "reasoning_content") -> str:
    return (
        "{% for m in messages %}<|{{ m.role }}|>"
        '{% if m["' + field + '"] %}' + start + '\n{{ m["' + field + '"] }}\n' + end + "\n\n"
        "{% endif %}{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>" + start + "\n{% endif %}"
    )


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (_thinking_template("<seed:think>", "</seed:think>"), ("<seed:think>", "</seed:think>")),
        (
            _thinking_template("<reasoning>", "</reasoning>", "reasoning"),
            ("<reasoning>", "</reasoning>"),
        ),
        (_thinking_template("[THINK]", "[/THINK]", "thinking"), ("[THINK]", "[/THINK]")),
        (_thinking_template("<think>", "</think>"), ("<think>", "</think>")),
    ],
    ids=["seed", "reasoning-field", "brackets", "think"],
)
def test_think_markers_are_learned_from_the_template(
    template: str, expected: tuple[str, str]
) -> None:
    assert learn_think_markers(renderer(template)) == expected


@pytest.mark.parametrize(
    "template",
    [
        _thinking_template("Thoughts:", "Answer:"),  # no tags: nothing to read spans by
        _thinking_template("<a>", "</b>"),  # not a tag and its closing form
        "{% for m in messages %}{{ m.content }}{% endfor %}",  # drops reasoning
        "{{ raise_exception('no') }}",
    ],
    ids=["words", "mismatched", "dropped", "refuses"],
)
def test_a_template_without_think_tags_teaches_none(template: str) -> None:
    assert learn_think_markers(renderer(template)) is None
