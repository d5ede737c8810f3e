"""The parser behind mlx-lm's real streaming detokenizer, fed one token at a time.

The test model's tokenizer (a byte-level BPE with <think> and <tool_call> tokens) splits text
the way a real model's does, including multi-byte characters over several tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.engine.output.parser import OutputParser, ParsedEvent, ParserConfig
from mlxlaunch.engine.types import TextDelta, ThinkingDelta, ToolCallEvent

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


def config_from(tokenizer: TokenizerWrapper, **overrides: object) -> ParserConfig:
    """What the engine derives from the loaded tokenizer."""
    config = ParserConfig(
        think_start=tokenizer.think_start,
        think_end=tokenizer.think_end,
        tool_call_start=tokenizer.tool_call_start,
        tool_call_end=tokenizer.tool_call_end,
        tool_parser=tokenizer.tool_parser,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def generate_by_token(
    tokenizer: TokenizerWrapper, parser: OutputParser, text: str
) -> list[ParsedEvent]:
    detokenizer = tokenizer.detokenizer
    events: list[ParsedEvent] = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        detokenizer.add_token(token)
        events += parser.feed(detokenizer.last_segment)
    detokenizer.finalize()
    events += parser.feed(detokenizer.last_segment)
    return events + parser.finish()


def test_token_by_token_output(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.think_start == "<think>" and tokenizer.tool_call_start == "<tool_call>"
    output = (
        "<think>\nPlan: call the tool für München.\n</think>\n\nIch prüfe das. 🌦\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "München"}}\n</tool_call>'
    )
    parser = OutputParser(config_from(tokenizer, stop_sequences=["NEVER"]))
    events = generate_by_token(tokenizer, parser, output)
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert thinking == "Plan: call the tool für München."
    assert text == "Ich prüfe das. 🌦"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "München"})
    ]
    assert not parser.stopped


def test_stop_sequence_across_tokens(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    parser = OutputParser(config_from(tokenizer, stop_sequences=["\n\nHuman:"]))
    events = generate_by_token(tokenizer, parser, "Sure thing.\n\nHuman: and then")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sure thing."
    assert parser.stopped_by == "\n\nHuman:"
