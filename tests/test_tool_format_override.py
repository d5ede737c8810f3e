"""`--tool-format`: naming the tool-call format of a model whose template hides it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typer.testing import CliRunner

from mlxlaunch.cli.main import app
from mlxlaunch.engine.runtime.loader import tool_syntax


@dataclass
class PlainTokenizer:
    """The parts of a tokenizer `tool_syntax` reads: a template with no tool markup."""

    chat_template: str = "{% for m in messages %}{{ m.content }}{% endfor %}"
    vocab: dict[str, int] = field(default_factory=dict)
    tool_parser: Any = None
    tool_call_start: str | None = None
    tool_call_end: str | None = None

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_nothing_detected_without_markup() -> None:
    syntax = tool_syntax(PlainTokenizer(), None)  # type: ignore[arg-type]
    assert syntax.dialect is None and syntax.parser is None


def test_a_named_mlx_lm_format_brings_its_markers_and_parser() -> None:
    syntax = tool_syntax(PlainTokenizer(), "mistral")  # type: ignore[arg-type]
    assert syntax.dialect is not None and syntax.dialect.name == "mistral"
    assert syntax.tool_call_start == "[TOOL_CALLS]"
    assert syntax.parser is not None
    assert syntax.parser('get_weather[ARGS]{"city": "Paris"}', None)["name"] == "get_weather"


def test_a_named_format_of_our_own_needs_no_mlx_lm_parser() -> None:
    syntax = tool_syntax(PlainTokenizer(), "deepseek_v31")  # type: ignore[arg-type]
    assert syntax.dialect is not None and not syntax.dialect.mlx_lm_parser
    assert syntax.tool_call_start == "<｜tool▁calls▁begin｜>" and syntax.parser is None


def test_an_unknown_format_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "demo", "--tool-format", "nope"])
    assert result.exit_code == 2
    assert "unknown tool-call format 'nope'" in result.output
