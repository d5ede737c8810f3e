"""Cache-stable rendering (engine/prompt/stable.py, render_date.py) on small hand-written
templates, each doing one thing real templates do to a conversation's past: drop old reasoning,
move the tools to the last user message, print today's date, empty think blocks on the newest
turn only, move a turn's text after its results — and one that is already stable (stable must
be exactly the template then) and one whose past changes in a way nothing fixes (newest message
first: exact then).

The property checked turn by turn: the prompt of each request starts with the previous prompt
followed by the turn the model generated for it, as the template writes that turn while it is
the newest message.
"""

from __future__ import annotations

import datetime
import typing
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from template_tokenizer import TemplateTokenizer

from mlxlaunch.cli.scheduler_options import RENDER_MODES as CLI_RENDER_MODES
from mlxlaunch.engine.config import RENDER_MODES, EngineConfig, RenderMode
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.prompt.render_date import (
    RENDER_DATE_FILE,
    clock_arguments,
    pinned_render_date,
    pinned_strftime,
)
from mlxlaunch.engine.prompt.stable import (
    StableRenderer,
    TextMemo,
    common_prefix_length,
    prefix_keys,
    without_reasoning,
)
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolCallRecord, ToolSpec
from mlxlaunch.launch.serving import EngineOptions

# --- the templates ----------------------------------------------------------------------

TOOLS_BLOCK = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}"
    ";{% endfor %}</tools>\n{% endif %}"
)
LAST_USER = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
)
CALLS = (
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</call>{% endfor %}"
)


def body(think: str = "m.reasoning_content", before: str = "", after_turn: str = "") -> str:
    """Turns as `<role>…</role>` lines; `think`: when a turn's reasoning shows."""
    return (
        "{% for m in messages %}" + before + "<{{ m.role }}>"
        + "{% if m.role == 'assistant' and (" + think + ") %}"
        + "<think>{{ m.reasoning_content or '' }}</think>{% endif %}"
        + "{{ m.content }}" + CALLS + "</{{ m.role }}>\n" + after_turn + "{% endfor %}"
        + "{% if add_generation_prompt %}<assistant>{% endif %}"
    )  # fmt: skip


# Already stable: every turn renders the same way whatever follows it.
STABLE = TOOLS_BLOCK + body()
# Reasoning shows only in turns after the last user message (Qwen3, GLM, MiniMax, Kimi…).
DROPS_OLD_REASONING = (
    TOOLS_BLOCK + LAST_USER + body("m.reasoning_content and loop.index0 > ns.last")
)
# Tools are written just before the last user message (Mistral-Small-3.2).
TOOLS_AT_LAST_USER = LAST_USER + body(
    before="{% if loop.index0 == ns.last %}" + TOOLS_BLOCK + "{% endif %}"
)
# Today's date at the top (gpt-oss).
PRINTS_DATE = "<date>{{ strftime_now('%Y-%m-%d') }}</date>\n" + STABLE
# An (empty) think block on assistant turns after the last user message (Qwen3.5, DeepSeek
# V3.2): the past changes even without any reasoning.
EMPTY_THINK_LATEST = TOOLS_BLOCK + LAST_USER + body("loop.index0 > ns.last")
# Newest message first: no earlier prompt is ever a prefix of a later one. Nothing fixes that.
NEWEST_FIRST = TOOLS_BLOCK + body().replace("in messages %}", "in messages | reverse %}")

TOOLS = [ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {}})]


# --- a Claude Code shaped session ---------------------------------------------------------


def session(reasoning: bool = True) -> list[tuple[list[ChatMessage], ChatMessage]]:
    """(conversation before an assistant turn, that turn) for each request of a session: a
    user prompt, a system turn, 2 tool rounds and an answer, a NEW user prompt, a tool round
    and an answer, a NEW user prompt (then an answer)."""
    conversation = [
        ChatMessage("system", "SYSTEM"),
        ChatMessage("user", "PROMPT_ONE"),
        ChatMessage("system", "SYSTEM_MID"),
    ]
    steps: list[tuple[list[ChatMessage], ChatMessage]] = []
    number = 0
    for prompt, rounds in (("", 2), ("PROMPT_TWO", 1), ("PROMPT_THREE", 0)):
        if prompt:
            conversation.append(ChatMessage("user", prompt))
        for step in range(rounds + 1):
            number += 1
            think = f"THINK_{number}" if reasoning else None
            if step < rounds:
                call = ToolCallRecord(f"toolu_{number:024d}", "Bash", {"command": f"ls {number}"})
                turn = ChatMessage(
                    "assistant", f"TEXT_{number}", reasoning=think, tool_calls=[call]
                )
                steps.append((list(conversation), turn))
                result = ChatMessage("tool", f"RESULT_{number}", tool_call_id=call.id, name="Bash")
                conversation += [turn, result]
            else:
                turn = ChatMessage("assistant", f"ANSWER_{number}", reasoning=think)
                steps.append((list(conversation), turn))
                conversation.append(turn)
    return steps


def request(messages: list[ChatMessage], thinking: bool = True) -> GenerationRequest:
    return GenerationRequest(messages=messages, max_tokens=8, tools=TOOLS, thinking=thinking)


def renderer_for(template: str, **kwargs: Any) -> tuple[PromptRenderer, TemplateTokenizer]:
    tokenizer = TemplateTokenizer(template)
    return PromptRenderer(tokenizer, **kwargs), tokenizer  # type: ignore[arg-type]


def turn_as_newest(
    renderer: PromptRenderer, before: list[ChatMessage], turn: ChatMessage
) -> tuple[str, str]:
    """(the end of the generation prompt the template writes otherwise once the turn is there,
    the turn as the template writes it while it is the newest message)."""
    with renderer.lock:
        prompt, tools = renderer.template_messages(request(before))
        with_turn, _ = renderer.template_messages(request([*before, turn]))
    apply = renderer.tokenizer.apply_chat_template
    generation = apply(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    written = apply(with_turn, tools=tools, add_generation_prompt=False, tokenize=False)
    shared = common_prefix_length(generation, written)
    return generation[shared:], written[shared:]


def re_rendered(renderer: PromptRenderer, reasoning: bool = True) -> list[int]:
    """Per request after the first: characters of the previous prompt and the turn generated
    for it that the new prompt does not start with (what the prefix cache re-prefills)."""
    lost: list[int] = []
    previous: str | None = None
    for before, turn in session(reasoning):
        prompt = renderer.render_text(request(before, reasoning))
        if previous is not None:
            lost.append(len(previous) - common_prefix_length(previous, prompt))
        seam, written = turn_as_newest(renderer, before, turn)
        previous = prompt.removesuffix(seam) + written
    return lost


# --- the renderer over each template -----------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [DROPS_OLD_REASONING, TOOLS_AT_LAST_USER, PRINTS_DATE, EMPTY_THINK_LATEST, STABLE],
    ids=["drops-old-reasoning", "tools-at-last-user", "prints-date", "empty-think", "stable"],
)
def test_every_prompt_extends_the_previous_prompt_and_turn(template: str) -> None:
    renderer, _ = renderer_for(template)
    for reasoning in (True, False):
        assert re_rendered(renderer, reasoning) == [0] * 5
    assert renderer.stable.exact_fallbacks == 0


@pytest.mark.parametrize("template", [DROPS_OLD_REASONING, TOOLS_AT_LAST_USER, EMPTY_THINK_LATEST])
def test_exact_mode_re_renders_the_past_at_each_new_user_prompt(template: str) -> None:
    renderer, _ = renderer_for(template, render_mode="exact")
    lost = re_rendered(renderer, reasoning=template != EMPTY_THINK_LATEST)
    # Requests 4 and 6 follow a new user prompt: the turns since the previous one re-render.
    assert [i for i, n in enumerate(lost) if n] == [2, 4]


@pytest.mark.parametrize("template", [DROPS_OLD_REASONING, EMPTY_THINK_LATEST, STABLE])
def test_a_conversation_that_opens_with_the_assistant_renders(template: str) -> None:
    renderer, _ = renderer_for(template)
    opening = ChatMessage("assistant", "TEXT_0")
    alone = renderer.render_text(request([opening]))
    answered = renderer.render_text(request([opening, ChatMessage("user", "PROMPT_ONE")]))
    assert "TEXT_0" in alone
    assert answered.index("TEXT_0") < answered.index("PROMPT_ONE")


def test_old_reasoning_is_kept_where_the_template_would_drop_it() -> None:
    stable, _ = renderer_for(DROPS_OLD_REASONING)
    exact, _ = renderer_for(DROPS_OLD_REASONING, render_mode="exact")
    conversation = [*session()[-1][0], session()[-1][1], ChatMessage("user", "PROMPT_FOUR")]
    kept = stable.render_text(request(conversation))
    dropped = exact.render_text(request(conversation))
    assert all(f"<think>THINK_{n}</think>TEXT_{n}" in kept for n in (1, 2, 4))
    assert "THINK" not in dropped
    assert kept.replace("<think>", "").count("TEXT_") == dropped.count("TEXT_")


def test_tools_stay_where_the_first_prompt_put_them() -> None:
    renderer, _ = renderer_for(TOOLS_AT_LAST_USER)
    conversation = [*session()[-1][0], session()[-1][1]]
    text = renderer.render_text(request(conversation))
    assert text.count("<tools>Bash: Run a shell command;</tools>") == 1
    assert text.index("<tools>") < text.index("PROMPT_ONE") < text.index("PROMPT_TWO")


def test_an_already_stable_template_renders_exactly_as_itself() -> None:
    stable, _ = renderer_for(STABLE)
    exact, _ = renderer_for(STABLE, render_mode="exact")
    for before, turn in session():
        for messages in (before, [*before, turn]):
            assert stable.render_text(request(messages)) == exact.render_text(request(messages))


def test_a_past_that_nothing_keeps_is_rendered_exactly() -> None:
    stable, _ = renderer_for(NEWEST_FIRST)
    exact, _ = renderer_for(NEWEST_FIRST, render_mode="exact")
    for before, _ in session():
        assert stable.render_text(request(before)) == exact.render_text(request(before))
    assert stable.stable.exact_fallbacks > 0


def test_text_the_template_moves_after_the_results_is_written_once() -> None:
    # Gemma writes a call turn's text after the tool results: neither kept twice nor lost.
    moves_text = TOOLS_BLOCK + (
        "{% for m in messages %}<{{ m.role }}>"
        "{% if m.role == 'assistant' %}" + CALLS + "{% if not m.tool_calls %}{{ m.content }}"
        "{% endif %}{% else %}{{ m.content }}{% endif %}"
        "{% if m.role == 'tool' %}{{ messages[loop.index0 - 1].content }}{% endif %}"
        "</{{ m.role }}>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    renderer, _ = renderer_for(moves_text)
    for before, _ in session():
        text = renderer.render_text(request(before))
        assert all(text.count(f"TEXT_{n}") <= 1 for n in range(1, 8)), text


def test_a_long_session_costs_a_few_renders_per_request() -> None:
    renderer, tokenizer = renderer_for(DROPS_OLD_REASONING)
    conversation = [ChatMessage("system", "SYSTEM"), ChatMessage("user", "PROMPT")]
    renderer.render_text(request(conversation))
    costs = []
    for number in range(40):
        if number % 10 == 9:
            conversation.append(ChatMessage("user", f"PROMPT_{number}"))
        call = ToolCallRecord(f"toolu_{number:024d}", "Bash", {"command": "ls"})
        conversation += [
            ChatMessage("assistant", "TEXT", reasoning=f"THINK_{number}", tool_calls=[call]),
            ChatMessage("tool", "RESULT", tool_call_id=call.id, name="Bash"),
        ]
        before = tokenizer.renders
        renderer.render_text(request(conversation))
        costs.append(tokenizer.renders - before)
    assert max(costs) <= 6, costs
    # A fresh renderer (no memo) gives the same prompt: the memo only saves work.
    fresh, _ = renderer_for(DROPS_OLD_REASONING)
    assert fresh.render_text(request(conversation)) == renderer.render_text(request(conversation))


def test_count_tokens_and_generation_render_alike_in_any_order() -> None:
    first, _ = renderer_for(DROPS_OLD_REASONING)
    second, _ = renderer_for(DROPS_OLD_REASONING)
    steps = session()
    last = [*steps[-1][0], steps[-1][1], ChatMessage("user", "PROMPT_FOUR")]
    texts = [first.render_text(request(before)) for before, _ in steps]
    # The same conversation, asked last-first (a count_tokens call out of turn), renders alike.
    assert second.render_text(request(last)) == first.render_text(request(last))
    assert [second.render_text(request(before)) for before, _ in steps] == texts


# --- the date -----------------------------------------------------------------------------


def test_the_printed_date_is_the_pinned_one_in_stable_mode_only() -> None:
    pinned = datetime.date(2025, 3, 4)
    stable, tokenizer = renderer_for(PRINTS_DATE, pinned_date=pinned)
    exact, _ = renderer_for(PRINTS_DATE, render_mode="exact", pinned_date=pinned)
    hello = request([ChatMessage("user", "hi")])
    assert stable.render_text(hello).startswith("<date>2025-03-04</date>\n<tools>")
    assert exact.render_text(hello).startswith(f"<date>{tokenizer.today.isoformat()}</date>\n")
    tokenizer.today += datetime.timedelta(days=1)  # midnight passes: the prompt stays
    assert stable.render_text(hello).startswith("<date>2025-03-04</date>\n")
    # Apart from the date, the pinned template renders as the template itself; without a
    # pinned date the renderer pins today's.
    same_day, _ = renderer_for(PRINTS_DATE)
    assert same_day.render_text(hello) == exact.render_text(hello)


def test_templates_that_print_no_date_are_not_touched() -> None:
    tokenizer = TemplateTokenizer(STABLE)
    assert (
        clock_arguments(STABLE, _call(tokenizer), datetime.date(2025, 1, 1), tokenizer.today) == {}
    )
    # strftime_now named but its output unused: no difference, nothing pinned.
    unused = "{% set today = strftime_now('%Y') %}" + STABLE
    tokenizer = TemplateTokenizer(unused)
    assert (
        clock_arguments(unused, _call(tokenizer), datetime.date(2025, 1, 1), tokenizer.today) == {}
    )


def test_a_template_that_prints_more_than_the_date_is_not_pinned() -> None:
    # The pinned clock knows only midnight: a template that prints more than the date (here
    # a random number standing for the time of day) keeps its own clock.
    template = "<now>{{ strftime_now('%Y') }}.{{ range(1000000) | random }}</now>" + STABLE
    tokenizer = TemplateTokenizer(template)
    assert (
        clock_arguments(template, _call(tokenizer), datetime.date(2025, 1, 1), tokenizer.today)
        == {}
    )


def test_the_pinned_strftime_knows_the_usual_directives() -> None:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    macro = pinned_strftime(datetime.date(2024, 7, 26))
    text = env.from_string(macro + "{{ strftime_now('%d %b %Y|%A %B %j|%y-%m-%d|100%%') }}")
    assert text.render() == "26 Jul 2024|Friday July 208|24-07-26|100%"
    # Its head leaves the template's first line as it was (trim_blocks eats the newline).
    assert env.from_string(macro + "\n  x").render() == "\n  x"


def _call(tokenizer: TemplateTokenizer) -> Any:
    return lambda messages, arguments: tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, **arguments
    )


def test_the_render_date_survives_restarts_in_the_cache_directory(tmp_path: Path) -> None:
    directory = tmp_path / "prefix-cache" / "model-identity"
    first = pinned_render_date(directory, today=lambda: datetime.date(2026, 2, 1))
    later = pinned_render_date(directory, today=lambda: datetime.date(2026, 2, 9))
    assert first == later == datetime.date(2026, 2, 1)
    assert (directory / RENDER_DATE_FILE).read_text() == "2026-02-01\n"
    (directory / RENDER_DATE_FILE).write_text("not a date")
    assert pinned_render_date(directory, today=lambda: datetime.date(2026, 3, 1)).day == 1
    assert (directory / RENDER_DATE_FILE).read_text() == "2026-03-01\n"
    assert pinned_render_date(None, today=lambda: datetime.date(2026, 4, 2)).month == 4
    assert [p.name for p in directory.iterdir()] == [RENDER_DATE_FILE]


def test_an_unwritable_cache_directory_gives_today(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    today = datetime.date(2026, 5, 5)
    assert pinned_render_date(blocked / "dir", today=lambda: today) == today


# --- pieces -------------------------------------------------------------------------------


def test_common_prefix_length_agrees_with_the_obvious_loop() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        a = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 400)))
        b = a[: rng.randrange(0, len(a) + 1)] + "".join(rng.choice("abc") for _ in range(5))
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix_length(a, b) == expected


def test_without_reasoning_writes_the_turn_as_the_shape_does_without_it() -> None:
    blocks = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "x"}],
    }
    assert without_reasoning(blocks) == {"role": "assistant", "content": "x"}
    keyed = {"role": "assistant", "content": "x", "reasoning_content": "t", "tool_calls": []}
    assert without_reasoning(keyed) == {"role": "assistant", "content": "x", "tool_calls": []}
    user = {"role": "user", "content": "u"}
    assert without_reasoning(user) is user


def test_the_memo_keeps_the_most_recent_texts_within_its_budget() -> None:
    memo = TextMemo(budget_chars=10)
    memo.put(("a", b""), "12345")
    memo.put(("b", b""), "12345")
    assert memo.get(("a", b"")) == "12345"  # now the most recent
    memo.put(("c", b""), "123")
    assert memo.get(("b", b"")) is None and memo.get(("a", b"")) and memo.chars == 8
    memo.put(("d", b""), "x" * 11)  # larger than the budget: not kept
    assert memo.get(("d", b"")) is None


def test_prefix_keys_name_each_prefix_and_its_context() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    keys = prefix_keys(messages, None, "ctx")
    assert len(set(keys)) == 3
    assert prefix_keys(messages[:1], None, "ctx") == keys[:2]
    assert prefix_keys(messages, None, "other")[1] != keys[1]
    assert prefix_keys(messages, [{"name": "t"}], "ctx")[1] != keys[1]
    reordered = [{"content": "a", "role": "user"}]  # key order is rendered: it counts
    assert prefix_keys(reordered, None, "ctx")[1] != keys[1]


def test_the_stable_renderer_alone_on_a_render_function() -> None:
    def render(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        parts = [
            f"[{m['role']}:{m.get('reasoning_content', '') if i > last_user else ''}{m['content']}]"
            for i, m in enumerate(messages)
        ]
        return "".join(parts) + ("[assistant:" if generation else "")

    stable = StableRenderer()
    turns = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "u2"},
    ]
    assert stable.render(turns, None, render, "") == "[user:u1][assistant:r1a1][user:u2][assistant:"


def test_a_part_moved_after_the_results_is_not_kept_twice() -> None:
    # A field no variant removes, written after the results once they follow: finding the
    # turn's end again would keep it twice, so the turn is re-rendered instead.
    def render(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        out, pending = [], ""
        for m in messages:
            if m["role"] == "assistant":
                out.append(f"[assistant]{m.get('note', '')}<call {m['call']}>")
                pending = m.get("note", "")
            else:
                out.append(f"[{m['role']}:{m['content']}]")
                if m["role"] == "tool" and pending:
                    out[-2] = out[-2].replace(pending, "", 1)
                    out.append(pending)
                    pending = ""
        return "".join(out) + ("[assistant]" if generation else "")

    messages = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "note": "NOTE_ONE", "call": "ARGUMENTS_OF_THE_CALL_ONE"},
        {"role": "tool", "content": "RESULT_ONE"},
    ]
    stable = StableRenderer()
    text = stable.render(messages, None, render, "")
    assert text == render(messages, None, True)
    assert text.count("NOTE_ONE") == 1


def test_the_render_mode_is_one_of_two_everywhere() -> None:
    assert set(typing.get_args(RenderMode)) == set(RENDER_MODES) == set(CLI_RENDER_MODES)
    assert EngineConfig(model="m").render == "stable"
    assert EngineOptions(render="exact").config_arguments()["render"] == "exact"
    with pytest.raises(ValueError, match="render"):
        EngineConfig(model="m", render="loose")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="render mode"):
        PromptRenderer(TemplateTokenizer(STABLE), render_mode="loose")  # type: ignore[arg-type]
