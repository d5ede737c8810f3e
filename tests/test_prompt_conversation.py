"""Conversations reshaped for strict chat templates, decided by probing what a template does.

Hand-written templates that are NOT among the real fixtures (each strict in its own words)
show that the probes read behaviour, not family names: a template that raises on consecutive
user turns, one that ignores tools, one that renders only a turn's first call, one that reads
reasoning only from `thinking`, one that checks ids, one that knows no tool role at all…
They run through a minimal tokenizer double that only applies its Jinja template.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from template_tokenizer import TemplateTokenizer

from mlxlaunch.engine.prompt.conversation import (
    calls_as_text,
    map_tool_ids,
    merge_consecutive_users,
    place_text_after_results,
    place_text_with_calls,
    split_parallel_calls,
)
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.prompt.template_behaviour import in_order, probe_template
from mlxlaunch.engine.prompt.template_modes import FAITHFUL, TemplateBehaviour
from mlxlaunch.engine.prompt.template_shape import message_to_template
from mlxlaunch.engine.prompt.tool_definitions import (
    deepseek_v31_section,
    generic_section,
    with_tool_section,
)
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolCallRecord, ToolSpec
from mlxlaunch.store.dialects import DIALECTS

# --- templates written for these tests (the tokenizer double: tests/template_tokenizer.py) ---


TOOLS_BLOCK = "{% for t in tools or [] %}<tool>{{ t.function | tojson }}</tool>\n{% endfor %}"


def template(
    *,
    tools: str = TOOLS_BLOCK,
    checks: str = "",
    calls: str = "m.tool_calls or []",
    reasoning: str = "m.reasoning_content",
    content: str = "m.content",
    system_anywhere: bool = True,
) -> str:
    """A small, faithful template; each keyword swaps in one strict or lossy behaviour."""
    system = (
        "" if system_anywhere else "{% if m.role == 'system' and not loop.first %}{% continue %}"
    )
    return (
        "{% for m in messages %}" + checks + "{% endfor %}" + tools + "{% for m in messages %}"
        + (system + "{% endif %}" if system else "")
        + "<{{ m.role }}>"
        + "{% if " + reasoning + " %}<think>{{ " + reasoning + " }}</think>{% endif %}"
        + "{{ " + content + " }}"
        + "{% for c in " + calls + " %}"
        + '<call id="{{ c.id }}">{{ c.function.name }} {{ c.function.arguments | tojson }}</call>'
        + "{% endfor %}"
        + "{% if m.role == 'tool' %} for {{ m.tool_call_id }}{% endif %}</{{ m.role }}>\n"
        + "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )  # fmt: skip


# Refuses a user turn right after a user turn or a tool result (its own words).
ALTERNATING = (
    "{% if m.role == 'user' and loop.index0 > 0 and messages[loop.index0 - 1].role in "
    "['user', 'tool'] %}{{ raise_exception('a user turn must follow an assistant turn') }}"
    "{% endif %}"
)
# Accepts only ids of exactly nine letters or digits, in calls and results.
NINE_CHAR_IDS = (
    "{% for c in m.tool_calls or [] %}{% if c.id | length != 9 or not c.id.isalnum() %}"
    "{{ raise_exception('call ids must be 9 alphanumerics') }}{% endif %}{% endfor %}"
    "{% if m.role == 'tool' and (m.tool_call_id | length != 9) %}"
    "{{ raise_exception('result ids must be 9 alphanumerics') }}{% endif %}"
)
# Refuses text and thinking together beside a call (gpt-oss's rule, in other words).
THINKING_OR_TEXT = (
    "{% if m.tool_calls and m.content and m.thinking %}"
    "{{ raise_exception('either thinking or text beside a call') }}{% endif %}"
)
# Knows only system, user and assistant turns.
NO_TOOL_ROLE = (
    "{% if m.role == 'tool' or m.tool_calls %}"
    "{{ raise_exception('only user and assistant turns') }}{% endif %}"
)
SYSTEM_AT_TOP = (
    "<system>{% for m in messages if m.role == 'system' %}{{ m.content }};{% endfor %}</system>"
    "{% for m in messages if m.role != 'system' %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>{% endfor %}"
    "</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)

TOOLS = [
    ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {"c": {}}}),
    ToolSpec("Read", "Read a file", {"type": "object", "properties": {"p": {}}}),
]


def call(letter: str, name: str = "Bash") -> ToolCallRecord:
    return ToolCallRecord(f"toolu_01{letter * 22}", name, {"arg": f"ARG_{letter}"})


def result(record: ToolCallRecord, letter: str) -> ChatMessage:
    return ChatMessage("tool", f"RESULT_{letter}", tool_call_id=record.id, name=record.name)


def hard_conversation() -> list[ChatMessage]:
    """What Claude Code sends at its hardest: a mid-conversation system turn, reasoning + text
    + two parallel calls, a user turn of [results, text], consecutive user turns."""
    a, b, c = call("A"), call("B", "Read"), call("C")
    return [
        ChatMessage("system", "SYSTEM_TOP"),
        ChatMessage("user", "USER_ONE"),
        ChatMessage("system", "SYSTEM_MID"),
        ChatMessage("assistant", "TEXT_ONE", reasoning="THINK_ONE", tool_calls=[a, b]),
        result(a, "A"),
        result(b, "B"),
        ChatMessage("user", "USER_AFTER_RESULTS"),
        ChatMessage("assistant", "TEXT_TWO", tool_calls=[c]),
        result(c, "C"),
        ChatMessage("assistant", "FINAL_ONE"),
        ChatMessage("user", "USER_NEXT"),
        ChatMessage("user", "USER_AGAIN"),
    ]


def request(messages: list[ChatMessage], tools: list[ToolSpec] = TOOLS) -> GenerationRequest:
    return GenerationRequest(messages=messages, max_tokens=8, tools=tools, thinking=True)


# Parts that must survive any template here (reasoning aside: templates may drop old reasoning).
KEPT = (
    "SYSTEM_MID", "USER_ONE", "ARG_A", "ARG_B", "RESULT_A", "RESULT_B", "USER_AFTER_RESULTS",
    "TEXT_ONE", "TEXT_TWO", "ARG_C", "RESULT_C", "FINAL_ONE", "USER_NEXT", "USER_AGAIN",
)  # fmt: skip


def rendered(chat_template: str, **kwargs: Any) -> tuple[PromptRenderer, str]:
    renderer = PromptRenderer(TemplateTokenizer(chat_template), **kwargs)  # type: ignore[arg-type]
    text = renderer.render_text(request(hard_conversation()))
    assert [p for p in KEPT if p not in text] == []
    assert "toolu_" not in text or renderer.behaviour.id_style == "any"
    assert text == renderer.render_text(request(hard_conversation()))  # deterministic
    return renderer, text


# --- the rewrites, one by one ---------------------------------------------------------------


def test_ids_map_to_the_family_form_and_results_follow() -> None:
    messages = hard_conversation()
    kimi = map_tool_ids(messages, "functions_index")
    assert [c.id for c in kimi[3].tool_calls] == ["functions.Bash:0", "functions.Read:1"]
    assert [kimi[4].tool_call_id, kimi[5].tool_call_id] == ["functions.Bash:0", "functions.Read:1"]
    assert kimi[7].tool_calls[0].id == kimi[8].tool_call_id == "functions.Bash:2"
    nine = map_tool_ids(messages, "alnum9")
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in nine[3].tool_calls)
    assert nine[4].tool_call_id == nine[3].tool_calls[0].id
    assert map_tool_ids(messages, "any") == messages
    assert messages[3].tool_calls[0].id.startswith("toolu_")  # the input is not modified
    # A later turn keeps the ids of the history (the prefix cache depends on it).
    longer = map_tool_ids(
        [*messages, ChatMessage("assistant", "", tool_calls=[call("D")])], "alnum9"
    )
    assert longer[: len(messages)] == nine


def test_parallel_calls_split_into_one_turn_per_call_with_its_result() -> None:
    a, b = call("A"), call("B")
    messages = [
        ChatMessage("user", "u"),
        ChatMessage("assistant", "text", reasoning="r", tool_calls=[a, b]),
        result(b, "B"),  # the client may answer in any order
        result(a, "A"),
        ChatMessage("tool", "stray", tool_call_id="unknown"),
        ChatMessage("user", "next"),
    ]
    split = split_parallel_calls(messages)
    assert [(m.role, m.content) for m in split] == [
        ("user", "u"),
        ("assistant", "text"),
        ("tool", "RESULT_A"),
        ("assistant", ""),
        ("tool", "RESULT_B"),
        ("tool", "stray"),
        ("user", "next"),
    ]
    assert split[1].reasoning == "r" and split[3].reasoning is None
    assert [m.tool_calls for m in (split[1], split[3])] == [[a], [b]]


def test_text_beside_a_call_moves_as_the_mode_says() -> None:
    turn = ChatMessage("assistant", "text", tool_calls=[call("A")])
    thinking = ChatMessage("assistant", "text", reasoning="r", tool_calls=[call("A")])
    assert place_text_with_calls([turn], "as_is") == [turn]
    assert place_text_with_calls([turn], "dropped") == [turn]
    text, calling = place_text_with_calls([turn], "split")
    assert (text.content, text.tool_calls, calling.content) == ("text", [], "")
    (moved,) = place_text_with_calls([turn], "into_reasoning")
    assert (moved.content, moved.reasoning) == ("", "text")
    (joined,) = place_text_with_calls([thinking], "split", "text_into_reasoning")
    assert (joined.content, joined.reasoning) == ("", "r\n\ntext")
    # Reasoning dropped: the turn is then placed like one without reasoning.
    text, calling = place_text_with_calls([thinking], "split", "drop_reasoning")
    assert (text.content, calling.reasoning) == ("text", None)


def test_text_after_results_joins_the_last_result() -> None:
    a = call("A")
    messages = [
        ChatMessage("assistant", "", tool_calls=[a]),
        result(a, "A"),
        ChatMessage("user", "more"),
        ChatMessage("user", ""),
    ]
    assert place_text_after_results(messages, "as_is") == messages
    joined = place_text_after_results(messages, "into_tool_result")
    assert [(m.role, m.content) for m in joined] == [
        ("assistant", ""),
        ("tool", "RESULT_A\n\nmore"),
    ]


def test_consecutive_users_merge() -> None:
    messages = [ChatMessage("user", "a"), ChatMessage("user", "b"), ChatMessage("assistant", "c")]
    assert [m.content for m in merge_consecutive_users(messages)] == ["a\n\nb", "c"]


def test_calls_as_text_for_templates_without_tool_turns() -> None:
    a = call("A")
    text = calls_as_text([ChatMessage("assistant", "doing", tool_calls=[a]), result(a, "A")])
    assert text[0] == ChatMessage(
        "assistant", 'doing\n\n{"name": "Bash", "arguments": {"arg": "ARG_A"}}'
    )
    assert text[1] == ChatMessage("user", "[Bash result]\nRESULT_A")


def test_reasoning_goes_under_the_field_the_template_reads() -> None:
    turn = ChatMessage("assistant", "text", reasoning="r")
    assert message_to_template(turn)["reasoning_content"] == "r"
    assert message_to_template(turn, "thinking")["thinking"] == "r"
    assert message_to_template(turn, "content_blocks")["content"] == [
        {"type": "thinking", "thinking": "r"},
        {"type": "text", "text": "text"},
    ]


def test_tool_sections() -> None:
    card = deepseek_v31_section(TOOLS)
    assert card.startswith("## Tools\nYou have access to the following tools:\n\n### Bash\n")
    assert "Description: Read a file\n\nParameters: " in card
    assert card.endswith(
        "- For multiple tool calls, chain them directly without separators or spaces"
    )
    generic = generic_section(TOOLS, "<call>example_tool {}</call>")
    assert '"name": "Read"' in generic and generic.endswith("<call>example_tool {}</call>")
    placed = with_tool_section([ChatMessage("system", "top"), ChatMessage("user", "u")], "T")
    assert placed[0].content == "top\n\nT"
    assert with_tool_section([ChatMessage("user", "u")], "T")[0] == ChatMessage("system", "T")


def test_in_order() -> None:
    assert in_order("a b c", ["a", "c"]) and not in_order("c a", ["a", "c"])
    assert not in_order("aa", ["a", "a", "a"])


# --- probing hand-written templates ---------------------------------------------------------


def probed(chat_template: str) -> TemplateBehaviour:
    tokenizer = TemplateTokenizer(chat_template)
    return probe_template(
        lambda messages, tools, generation: tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation
        )
    )


def test_a_faithful_template_needs_no_rewrite() -> None:
    faithful = dataclasses.replace(FAITHFUL, ids_rendered=True)  # this one writes ids
    assert probed(template()) == faithful
    renderer, text = rendered(template())
    assert renderer.behaviour == faithful
    assert "<think>THINK_ONE</think>" in text


def test_a_template_that_refuses_consecutive_users_and_text_after_results() -> None:
    behaviour = probed(template(checks=ALTERNATING))
    assert not behaviour.consecutive_users
    assert behaviour.text_after_results == "into_tool_result"
    _, text = rendered(template(checks=ALTERNATING))
    assert "RESULT_B\n\nUSER_AFTER_RESULTS for" in text
    assert "USER_NEXT\n\nUSER_AGAIN" in text


def test_a_template_that_renders_only_the_first_call() -> None:
    assert probed(template(calls="(m.tool_calls or [])[:1]")).parallel_calls == "split"
    _, text = rendered(template(calls="(m.tool_calls or [])[:1]"))
    assert in_order(text, ["ARG_A", "RESULT_A", "ARG_B", "RESULT_B"])


def test_a_template_that_reads_reasoning_only_from_thinking() -> None:
    chat_template = template(reasoning="m.thinking", checks=THINKING_OR_TEXT)
    behaviour = probed(chat_template)
    assert behaviour.reasoning_field == "thinking"
    assert behaviour.reasoning_text_call == "text_into_reasoning"
    _, text = rendered(chat_template)
    assert "<think>THINK_ONE\n\nTEXT_ONE</think>" in text


def test_a_template_that_checks_ids_gets_ids_it_accepts() -> None:
    behaviour = probed(template(checks=NINE_CHAR_IDS))
    assert behaviour.id_style == "alnum9" and behaviour.ids_rendered
    _, text = rendered(template(checks=NINE_CHAR_IDS))
    ids = re.findall(r'<call id="([^"]*)">', text)
    assert len(ids) == 3 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
    assert all(f"for {i}</tool>" in text for i in ids)


def test_a_template_that_drops_text_beside_calls_gets_a_text_turn() -> None:
    chat_template = template(content="m.content if not m.tool_calls else ''")
    assert probed(chat_template).text_with_call == "split"
    rendered(chat_template)  # TEXT_ONE and TEXT_TWO are kept


def test_a_template_that_drops_later_system_turns() -> None:
    behaviour = probed(template(system_anywhere=False))
    assert not behaviour.system_turns
    _, text = rendered(template(system_anywhere=False))
    assert "USER_ONE\n\n<system-instruction>\nSYSTEM_MID\n</system-instruction>" in text


def test_a_template_that_moves_system_turns_to_the_top_keeps_them_in_place() -> None:
    assert not probed(SYSTEM_AT_TOP).system_turns


def test_a_template_without_tool_turns_gets_calls_as_text() -> None:
    behaviour = probed(template(checks=NO_TOOL_ROLE))
    assert not behaviour.calls_rendered
    _, text = rendered(template(checks=NO_TOOL_ROLE))
    assert '{"name": "Read", "arguments": {"arg": "ARG_B"}}' in text
    assert "[Read result]\nRESULT_B" in text


def test_a_template_that_ignores_tools_gets_them_in_the_system_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chat_template = template(tools="")
    behaviour = probed(chat_template)
    assert not behaviour.tools_rendered
    # The example call is written the way this template writes an assistant's call.
    assert behaviour.call_example == (
        '<call id="toolu_01mlxprobeExample">example_tool {"argument": "value"}</call></assistant>'
    )
    with caplog.at_level(logging.WARNING):
        renderer, text = rendered(chat_template)
        renderer.render_text(request(hard_conversation()))
    assert text.startswith("<system>SYSTEM_TOP\n\n# Tools\n")
    assert '"name": "Bash", "description": "Run a shell command"' in text
    assert 'example_tool {"argument": "value"}</call>' in text
    warnings = [r for r in caplog.records if "ignores tool definitions" in r.getMessage()]
    assert len(warnings) == 1  # once per model
    # A family with a documented format gets it.
    _, card = rendered(chat_template, dialect=DIALECTS["deepseek_v31"])
    assert "## Tools\nYou have access to the following tools:\n\n### Bash\n" in card


def test_a_template_that_needs_a_tool_list_gets_an_empty_one() -> None:
    """Issue 35, item 10: a template that iterates `tools` (or takes its length) failed on a
    request without tools — a 400 "the prompt could not be rendered"."""
    chat_template = template(
        tools="{% for t in tools %}<tool>{{ t.function | tojson }}</tool>\n{% endfor %}"
    )
    with pytest.raises(TypeError):  # what the template does with tools=None
        TemplateTokenizer(chat_template).apply_chat_template([{"role": "user", "content": "x"}])
    behaviour = probed(chat_template)
    assert behaviour.empty_tools and behaviour.tools_rendered
    assert dataclasses.replace(behaviour, empty_tools=False) == probed(template())  # the rest
    renderer = PromptRenderer(TemplateTokenizer(chat_template))  # type: ignore[arg-type]
    text = renderer.render_text(request(hard_conversation(), tools=[]))
    assert [p for p in KEPT if p not in text] == []
    with_tools, _ = rendered(chat_template)
    assert '"name": "Bash"' in with_tools.render_text(request(hard_conversation()))


def test_a_template_that_refuses_tools_gets_them_in_the_system_prompt() -> None:
    """A template written for a model without tool use raises when it is given tools: it
    gets none, and the definitions go where a template that ignores them gets them."""
    refusing = "{% if tools %}{{ raise_exception('tools are not supported') }}{% endif %}"
    chat_template = refusing + template()
    behaviour = probed(chat_template)
    assert not behaviour.tools_accepted and not behaviour.tools_rendered
    assert behaviour.calls_rendered  # the probes render calls without offering tools
    _, text = rendered(chat_template)
    assert text.startswith("<system>SYSTEM_TOP\n\n# Tools\n")
    assert '"name": "Bash", "description": "Run a shell command"' in text


def test_gpt_oss_reasoning_goes_under_thinking_where_nothing_aliases_it() -> None:
    """Recent transformers copy `reasoning_content` into gpt-oss's `thinking`; older ones
    (and this double) do not, and the probe then finds `thinking` itself."""
    source = (Path(__file__).parent / "fixtures/chat-templates/gpt-oss-120b.jinja").read_text()
    behaviour = probed(source)
    assert behaviour.reasoning_field == "thinking"
    assert behaviour.reasoning_text_call == "text_into_reasoning"
    assert behaviour.parallel_calls == "split" and not behaviour.system_turns
    renderer = PromptRenderer(TemplateTokenizer(source))  # type: ignore[arg-type]
    messages = hard_conversation()[:6]  # ends with the results of the reasoning turn
    text = renderer.render_text(request(messages))
    assert "<|channel|>analysis<|message|>THINK_ONE\n\nTEXT_ONE<|end|>" in text
    assert in_order(text, ["ARG_A", "RESULT_A", "ARG_B", "RESULT_B"])


def test_the_dialect_decides_the_id_form() -> None:
    _, text = rendered(template(), dialect=DIALECTS["kimi_k2"])
    assert re.findall(r'<call id="([^"]*)">', text) == [
        "functions.Bash:0",
        "functions.Read:1",
        "functions.Bash:2",
    ]
    assert "for functions.Read:1</tool>" in text


def test_the_template_is_probed_once_and_again_when_it_changes() -> None:
    tokenizer = TemplateTokenizer(template())
    renderer = PromptRenderer(tokenizer, render_mode="exact")  # type: ignore[arg-type]
    renderer.render_text(request(hard_conversation()))
    after_first = tokenizer.renders
    renderer.render_text(request(hard_conversation()))
    assert tokenizer.renders == after_first + 1  # no new probes
    tokenizer.chat_template = template(checks=ALTERNATING)
    text = renderer.render_text(request(hard_conversation()))
    assert "USER_NEXT\n\nUSER_AGAIN" in text


def test_history_renders_as_it_did_on_the_turn_before() -> None:
    """Turn N+1's prompt starts with turn N's (prefix cache), whatever was rewritten."""
    strict = template(
        checks=ALTERNATING + NINE_CHAR_IDS + THINKING_OR_TEXT,
        calls="(m.tool_calls or [])[:1]",
        reasoning="m.thinking",
        system_anywhere=False,
    )
    renderer = PromptRenderer(TemplateTokenizer(strict))  # type: ignore[arg-type]
    conversation = hard_conversation()
    full = renderer.render_text(request(conversation))
    for cut, message in enumerate(conversation):
        if message.role == "assistant":
            assert full.startswith(renderer.render_text(request(conversation[:cut]))), cut
