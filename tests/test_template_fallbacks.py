"""Templates that used to fail a request shape or leak markup (issue 35, item 10), served by
the real app to the real SDKs, on offline models built with each template.

A template that iterates `tools` failed every request without tools (a 400 "the prompt could
not be rendered"); one that refuses tools failed every request with them; one that thinks in
tags no table knows (`<seed:think>`) sent its thinking to the client as text. Now the first
gets an empty tool list, the second its tools in the system prompt, and the third's markers
are learned from the template, as a call syntax no table knows is."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import Served, scripted_server
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import TemplateFamily, template_family

pytestmark = pytest.mark.slow  # every test here serves a model

TOKEN = "fallback-token"
QWEN = template_family("qwen")
FIRST_LINE = '{%- set first_is_system = messages and messages[0].role == "system" -%}'
TEMPLATES = {
    # Takes the length of `tools` whatever the request: None has none.
    "iterates_tools": QWEN.chat_template().replace(
        FIRST_LINE, FIRST_LINE + "\n{%- set tool_count = tools | length -%}"
    ),
    # Written for a model without tool use.
    "refuses_tools": QWEN.chat_template().replace(
        FIRST_LINE,
        '{%- if tools -%}{{ raise_exception("This model does not support tools.") }}{%- endif -%}\n'
        + FIRST_LINE,
    ),
    # Thinks in tags of its own, plain text in its vocabulary.
    "own_think_tags": QWEN.chat_template()
    .replace("<think>", "<seed:think>")
    .replace("</think>", "</seed:think>"),
}
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
USER = [{"role": "user", "content": "hi"}]


def prompt_of(served: Served, index: int = -1) -> str:
    """The prompt text of a request the engine generated for (the real renderer)."""
    renderer = PromptRenderer(load_tokenizer(served.directory))
    return renderer.render_text(served.scripted.requests[index])


def _family(name: str) -> TemplateFamily:
    markup = QWEN.markup_tokens
    if name == "own_think_tags":  # its tags are no added tokens: nothing tells them apart
        markup = tuple(t for t in markup if "think" not in t)
    return dataclasses.replace(QWEN, name=name, template_text=TEMPLATES[name], markup_tokens=markup)


def _served(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = build_model(tmp_path_factory.mktemp(name), "tiny", template=_family(name))
    with scripted_server(Path(directory), TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def iterates_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("iterates_tools", tmp_path_factory)


@pytest.fixture(scope="module")
def refuses_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("refuses_tools", tmp_path_factory)


@pytest.fixture(scope="module")
def own_think_tags(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("own_think_tags", tmp_path_factory)


def test_a_template_that_iterates_tools_serves_requests_without_tools(
    iterates_tools: Served,
) -> None:
    iterates_tools.scripted.enqueue("Hello.")
    message = iterates_tools.anthropic.messages.create(model="m", max_tokens=16, messages=USER)
    assert message.content[0].type == "text" and message.content[0].text == "Hello."
    iterates_tools.scripted.enqueue("Hi.")
    completion = iterates_tools.openai.chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].message.content == "Hi."
    iterates_tools.scripted.enqueue(CALL)
    called = iterates_tools.anthropic.messages.create(
        model="m", max_tokens=64, messages=USER, tools=[TOOL]
    )
    assert called.content[-1].type == "tool_use" and called.content[-1].input == {"city": "Oslo"}


def test_a_template_that_refuses_tools_gets_them_in_the_system_prompt(
    refuses_tools: Served,
) -> None:
    refuses_tools.scripted.enqueue(CALL)
    called = refuses_tools.anthropic.messages.create(
        model="m", max_tokens=64, messages=USER, tools=[TOOL]
    )
    assert called.stop_reason == "tool_use"
    assert called.content[-1].type == "tool_use" and called.content[-1].input == {"city": "Oslo"}
    prompt = prompt_of(refuses_tools)
    assert "The weather in a city" in prompt.split("<|im_start|>user")[0]  # the system turn
    refuses_tools.scripted.enqueue("Plain.")
    plain = refuses_tools.openai.responses.create(model="m", input="hi", store=False)
    assert plain.output_text == "Plain."


def test_think_tags_no_table_knows_never_reach_the_client_as_text(
    own_think_tags: Served,
) -> None:
    # Thinking on: the prompt opens `<seed:think>`; the model closes it and answers.
    own_think_tags.scripted.enqueue("Let me see.\n</seed:think>\n\nSunny.")
    with own_think_tags.anthropic.messages.stream(
        model="m", max_tokens=64, messages=USER, thinking={"type": "enabled", "budget_tokens": 32}
    ) as stream:
        message = stream.get_final_message()
    kinds = [
        (block.type, getattr(block, "thinking", getattr(block, "text", "")))
        for block in message.content
    ]
    assert kinds == [("thinking", "Let me see."), ("text", "Sunny.")]
    # Thinking off: the template writes an empty span, and a model that thinks anyway writes
    # its own, which is thinking too (never text with markers in it).
    own_think_tags.scripted.enqueue("<seed:think>\nHmm.\n</seed:think>\n\nRainy.")
    completion = own_think_tags.openai.chat.completions.create(model="m", messages=USER)
    reply = completion.choices[0].message
    assert reply.content == "Rainy." and "seed:think" not in (reply.content or "")
    own_think_tags.scripted.enqueue("<seed:think>\nHmm.\n</seed:think>\n\nFoggy.")
    response = own_think_tags.openai.responses.create(model="m", input="hi", store=False)
    assert response.output_text == "Foggy."
