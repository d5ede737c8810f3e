"""Cache-stable rendering under every REAL chat template of tests/fixtures/chat-templates/.

A Claude Code shaped session — Claude Code's captured system prompt and tools, a user prompt,
a mid-conversation system turn, 3 tool rounds, a NEW user prompt, 2 tool rounds, a NEW user
prompt; every assistant turn with a thinking block, text and a tool_use; each loop ends with an
answer (thinking + text) or, "interrupted", the new prompt follows the last result — is
rendered request by request (and once more without thinking: no reasoning anywhere). Each
request's stable prompt must start with the previous prompt
followed by the turn generated for it (as the template writes that turn while it is the newest
message), re-rendering at most SEAM_TOKENS of it: what the prefix cache re-prefills. Exact mode
must be the template's own output, and stable mode must equal it wherever the template already
keeps the past.

Rendering needs only a tokenizer: the module fixture writes the test builder's tokenizer (real
template, local BPE vocabulary) per family and skips the weights.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from real_templates import tokenizer_builder

from mlxlaunch.engine.prompt.render import PromptRenderer, RenderMode
from mlxlaunch.engine.prompt.stable import Strip, common_prefix_length, stripped
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolCallRecord, ToolSpec
from mlxlaunch.store.dialects import detect_dialect

pytestmark = pytest.mark.slow  # builds a tokenizer per family

FIXTURES = Path(__file__).parent / "fixtures"
TEMPLATES = FIXTURES / "chat-templates"
FAMILIES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))
# Re-tokenising where a re-rendered turn end meets the rest may shift a few tokens; beyond
# this a request lost part of the previous prompt.
SEAM_TOKENS = 64
# Templates whose date line is pinned in stable mode.
PRINTS_DATE = ("gpt-oss-120b", "mistral-small-3.2")


@pytest.fixture(scope="module")
def tokenizer_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TokenizerWrapper]:
    return tokenizer_builder(tmp_path_factory.mktemp("stable-templates"))


def new_renderer(tokenizer: TokenizerWrapper, mode: RenderMode = "stable") -> PromptRenderer:
    """A renderer wired as the engine wires it: with the dialect the model's files show."""
    dialect = detect_dialect(tokenizer.chat_template, tokenizer.get_vocab())
    return PromptRenderer(tokenizer, dialect=dialect, render_mode=mode)


# --- the session ------------------------------------------------------------------------------


def captured_opening() -> tuple[str, str, list[ToolSpec]]:
    """Claude Code's system prompt (without its per-conversation billing header), first user
    prompt and tools, from a captured request."""
    path = FIXTURES / "claude-code-2.1.332" / "print-mode-request.json"
    body = json.loads(path.read_text())["body"]
    system = "\n\n".join(
        block["text"]
        for block in body["system"]
        if not block["text"].startswith("x-anthropic-billing-header")
    )
    prompt = "\n\n".join(b["text"] for b in body["messages"][0]["content"] if b["type"] == "text")
    tools = [ToolSpec(t["name"], t["description"], t["input_schema"]) for t in body["tools"]]
    return system, prompt, tools


SYSTEM, FIRST_PROMPT, TOOLS = captured_opening()
PLAN = (("", 3), ("Now look at the tests, please.", 2), ("Thanks. Summarise in a line.", 0))


@dataclass(frozen=True)
class Step:
    """One request of the session: the conversation it sends, and the turn generated for it."""

    before: list[ChatMessage]
    turn: ChatMessage


def session(answered: bool, thinking: bool = True) -> list[Step]:
    conversation = [
        ChatMessage("system", SYSTEM),
        ChatMessage("user", FIRST_PROMPT),
        ChatMessage("system", "The user prefers short answers."),
    ]
    steps: list[Step] = []
    number = 0
    for prompt, rounds in PLAN:
        if prompt:
            conversation.append(ChatMessage("user", prompt))
        for step in range(rounds + 1):
            number += 1
            thought = f"I should look at part {number} of the project first. " * 4
            reasoning = thought if thinking else None
            if step == rounds:
                if answered or not rounds:
                    answer = f"Part {number} holds two modules; both look fine."
                    turn = ChatMessage("assistant", answer, reasoning)
                    steps.append(Step(list(conversation), turn))
                    conversation.append(turn)
                continue
            call = ToolCallRecord(
                id=f"toolu_01{number:022d}",
                name="Bash",
                arguments={"command": f"ls src/part{number}", "description": "List the part"},
            )
            turn = ChatMessage("assistant", f"Let me list part {number}.", reasoning, [call])
            steps.append(Step(list(conversation), turn))
            listing = f"main{number}.py\ntest_main{number}.py\nREADME{number}.md"
            conversation += [turn, ChatMessage("tool", listing, tool_call_id=call.id, name="Bash")]
    return steps


def request(messages: list[ChatMessage], thinking: bool = True) -> GenerationRequest:
    return GenerationRequest(messages=messages, max_tokens=64, tools=TOOLS, thinking=thinking)


# --- measuring --------------------------------------------------------------------------------


def template_render(
    renderer: PromptRenderer,
    messages: list[dict[str, Any]],
    tools: Any,
    generation: bool,
    thinking: bool = True,
) -> str:
    return str(
        renderer.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=generation,
            enable_thinking=thinking,
            tokenize=False,
        )
    )


def turn_as_newest(renderer: PromptRenderer, step: Step, thinking: bool) -> tuple[str, str]:
    """(the end of the generation prompt the template writes otherwise once the turn is there,
    the turn as the template writes it while it is the newest message). Where adding the turn
    re-renders earlier turns (gpt-oss drops their analysis once a final answer follows), the
    earlier turns go in as they are then written: without reasoning, then without text."""
    with renderer.lock:
        before, tools = renderer.template_messages(request(step.before, thinking))
        with_turn, _ = renderer.template_messages(request([*step.before, step.turn], thinking))
    new = with_turn[len(before) :]
    strips: tuple[Strip, ...] = ("nothing", "reasoning", "reasoning_and_text")
    for strip in strips:
        past = [stripped(m, strip) for m in before]
        generation = template_render(renderer, past, tools, True, thinking)
        written = template_render(renderer, [*past, *new], tools, False, thinking)
        shared = common_prefix_length(generation, written)
        if len(generation) - shared <= 64:
            return generation[shared:], written[shared:]
    raise AssertionError("adding the turn re-renders the past whatever is left out")


def common_length(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@dataclass(frozen=True)
class Figures:
    prompts: list[str]  # each request's prompt
    tokens: list[int]  # its length in tokens
    lost_chars: list[int]  # per request after the first: previous prompt + turn not kept
    lost_tokens: list[int]


def run(renderer: PromptRenderer, answered: bool, thinking: bool = True) -> Figures:
    encode = renderer.tokenizer.encode
    prompts, tokens, lost_chars, lost_tokens = [], [], [], []
    cached: str | None = None  # the previous prompt and the turn generated for it
    for step in session(answered, thinking):
        prompt = renderer.render_text(request(step.before, thinking))
        ids = encode(prompt, add_special_tokens=False)
        if cached is not None:
            lost_chars.append(len(cached) - common_prefix_length(cached, prompt))
            held = encode(cached, add_special_tokens=False)
            lost_tokens.append(len(held) - common_length(held, ids))
        seam, written = turn_as_newest(renderer, step, thinking)
        cached = prompt.removesuffix(seam) + written
        prompts.append(prompt)
        tokens.append(len(ids))
    return Figures(prompts, tokens, lost_chars, lost_tokens)


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answered", "thinking"),
    [(True, True), (False, True), (True, False)],
    ids=["answered", "interrupted", "no-thinking"],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_prompt_extends_the_previous_prompt_and_turn(
    family: str, answered: bool, thinking: bool, tokenizer_of: Callable[[str], TokenizerWrapper]
) -> None:
    tokenizer = tokenizer_of(family)
    stable = run(new_renderer(tokenizer), answered, thinking)
    exact = run(new_renderer(tokenizer, "exact"), answered, thinking)
    print(
        f"{family}: re-rendered per request, stable {stable.lost_tokens} tokens "
        f"({stable.lost_chars} chars), exact {exact.lost_tokens} tokens; prompt tokens "
        f"stable {stable.tokens}, exact {exact.tokens}"
    )
    assert max(stable.lost_tokens) <= SEAM_TOKENS, stable.lost_tokens
    # Stable never loses more than exact; where exact keeps the past, stable is exact.
    assert all(
        s <= max(e, SEAM_TOKENS) for s, e in zip(stable.lost_tokens, exact.lost_tokens, strict=True)
    )
    if max(exact.lost_chars) == 0:
        assert stable.prompts == exact.prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_mode_is_the_templates_own_output(
    family: str, tokenizer_of: Callable[[str], TokenizerWrapper]
) -> None:
    renderer = new_renderer(tokenizer_of(family), "exact")
    for step in session(answered=True)[-3:]:
        for messages in (step.before, [*step.before, step.turn]):
            with renderer.lock:
                shaped, tools = renderer.template_messages(request(messages))
            own = template_render(renderer, shaped, tools, True)
            assert renderer.render_text(request(messages)) == own


def test_the_template_date_is_pinned_with_the_installed_transformers(
    tokenizer_of: Callable[[str], TokenizerWrapper],
) -> None:
    hello = request([ChatMessage("user", "hi")])
    pinned = datetime.date(2025, 3, 4)
    for family in FAMILIES:
        tokenizer = tokenizer_of(family)
        dialect = detect_dialect(tokenizer.chat_template, tokenizer.get_vocab())
        stable = PromptRenderer(tokenizer, dialect=dialect, pinned_date=pinned)
        exact = new_renderer(tokenizer, "exact")
        text, own = stable.render_text(hello), exact.render_text(hello)
        if family in PRINTS_DATE:
            today = datetime.date.today().isoformat()
            assert "2025-03-04" in text and "2025-03-04" not in own and today in own
            assert text.replace("2025-03-04", today) == own
        else:
            assert text == own, family


def test_qwen3_figures(tokenizer_of: Callable[[str], TokenizerWrapper]) -> None:
    """The trade-off in numbers (engine/prompt/stable.py's docstring): tokens kept in context
    against tokens re-prefilled at each new user prompt."""
    tokenizer = tokenizer_of("qwen3-0.6b")
    stable = run(new_renderer(tokenizer), answered=True)
    exact = run(new_renderer(tokenizer, "exact"), answered=True)
    print("qwen3-0.6b prompt tokens per request: stable", stable.tokens, "exact", exact.tokens)
    print(
        "re-prefilled of the previous prompt: stable",
        stable.lost_tokens,
        "exact",
        exact.lost_tokens,
    )
    new_prompts = [i - 1 for i, step in enumerate(session(True)) if step.before[-1].role == "user"]
    new_prompts = [i for i in new_prompts if i >= 0]
    assert all(exact.lost_tokens[i] > 200 for i in new_prompts)
    assert stable.lost_tokens == [0] * len(stable.lost_tokens)
    assert stable.tokens[-1] > exact.tokens[-1]  # the reasoning the template drops is kept
