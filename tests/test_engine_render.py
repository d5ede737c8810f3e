"""Prompt rendering through the test model's real chat template and tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.prompt.render import (
    PromptRenderer,
    ends_inside_span,
    message_to_template,
    tool_to_template,
)
from mlxlaunch.engine.types import (
    ChatMessage,
    GenerationRequest,
    ToolCallRecord,
    ToolSpec,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> TokenizerWrapper:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def renderer(tokenizer: TokenizerWrapper) -> PromptRenderer:
    return PromptRenderer(tokenizer)


def conversation(thinking: bool = True) -> GenerationRequest:
    return GenerationRequest(
        messages=[
            ChatMessage("system", "You are terse."),
            ChatMessage("user", "list files"),
            ChatMessage(
                "assistant",
                "",
                reasoning="I should run ls",
                tool_calls=[ToolCallRecord("call_1", "Bash", {"command": "ls"})],
            ),
            ChatMessage("tool", "a.txt\nb.txt", tool_call_id="call_1", name="Bash"),
        ],
        max_tokens=10,
        tools=[
            ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {}}),
            ToolSpec("Alpha", "First by name, second by the client", {"type": "object"}),
        ],
        thinking=thinking,
    )


def test_messages_take_the_chat_template_shape() -> None:
    call = ToolCallRecord("call_1", "Bash", {"command": "ls"})
    assistant = message_to_template(
        ChatMessage("assistant", "ok", reasoning="hmm", tool_calls=[call])
    )
    assert assistant == {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "hmm",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "Bash", "arguments": {"command": "ls"}},
            }
        ],
    }
    tool = message_to_template(ChatMessage("tool", "out", tool_call_id="call_1", name="Bash"))
    assert tool == {"role": "tool", "content": "out", "tool_call_id": "call_1", "name": "Bash"}
    assert tool_to_template(ToolSpec("T", "d", {"type": "object"})) == {
        "type": "function",
        "function": {"name": "T", "description": "d", "parameters": {"type": "object"}},
    }


@pytest.mark.slow
def test_history_tools_and_results_are_rendered_in_client_order(
    renderer: PromptRenderer,
) -> None:
    text = renderer.render_text(conversation())
    assert text.index('"name": "Bash"') < text.index('"name": "Alpha"')  # not re-sorted
    assert "I should run ls" in text
    assert '{"name": "Bash", "arguments": {"command": "ls"}}' in text
    assert "a.txt\nb.txt" in text
    assert text.startswith("<|im_start|>system\nYou are terse.")


@pytest.mark.slow
def test_rendering_is_deterministic_and_tokenized_once(renderer: PromptRenderer) -> None:
    first = renderer.render(conversation())
    second = renderer.render(conversation())
    assert first.tokens == second.tokens
    tokenizer = renderer.tokenizer
    assert tokenizer.decode(first.tokens) == renderer.render_text(conversation())


@pytest.mark.slow
def test_thinking_on_opens_a_span_and_off_closes_it(renderer: PromptRenderer) -> None:
    assert renderer.render(conversation(thinking=True)).opens_thinking
    off = renderer.render(conversation(thinking=False))
    assert not off.opens_thinking
    assert renderer.render_text(conversation(thinking=False)).rstrip().endswith("</think>")


def test_ends_inside_span() -> None:
    assert ends_inside_span("a <think>\n", "<think>", "</think>")
    assert not ends_inside_span("<think>x</think>\n", "<think>", "</think>")
    assert not ends_inside_span("no span", "<think>", "</think>")
    assert not ends_inside_span("<think>", None, None)
