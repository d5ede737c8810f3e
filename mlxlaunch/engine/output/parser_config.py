"""What the output parser needs for one request, and which parser reads the model's output.

The model's dialect (`ModelInfo.dialect`) decides how tool-call spans are read: our streaming
readers where the family has one (arguments reach the client while they are generated), else
mlx-lm's parser for the family over the whole span. Harmony (gpt-oss) is not markup inside
text but a sequence of channel messages, so it has a parser of its own.
"""

from __future__ import annotations

from typing import Protocol

from mlxlaunch.engine.output.families import span_reader_for
from mlxlaunch.engine.output.harmony import HarmonyParser
from mlxlaunch.engine.output.parser import OutputParser, ParsedEvent, ParserConfig
from mlxlaunch.engine.output.tools import ToolParser
from mlxlaunch.engine.types import GenerationRequest, ModelInfo


def parser_config(
    info: ModelInfo,
    tool_parser: ToolParser | None,
    request: GenerationRequest,
    *,
    opens_thinking: bool,
) -> ParserConfig:
    """What the parser needs for one request: the model's markup (`info`, and its tokenizer's
    `tool_parser`), the request's tools and stops, and whether its prompt opened a think span."""
    dialect = info.dialect
    reader = span_reader_for(dialect, request.tools) if dialect is not None else None
    return ParserConfig(
        think_start=info.think_start,
        think_end=info.think_end,
        start_in_thinking=opens_thinking,
        tool_call_start=info.tool_call_start,
        tool_call_end=info.tool_call_end,
        tool_parser=tool_parser,
        span_reader=reader,
        leading_call=dialect.leading_call if dialect is not None else None,
        tools=list(request.tools),
        # Markup is a call only when tools were offered and calls are allowed; else it is text.
        tools_enabled=bool(request.tools) and request.tool_choice.mode != "none",
        stop_sequences=list(request.stop_sequences),
        # Without parallel calls the turn ends after the first one.
        max_tool_calls=None if request.tool_choice.parallel else 1,
        calls_forced=bool(request.tools) and request.tool_choice.mode in ("any", "tool"),
    )


class ModelOutputParser(Protocol):
    """What the engine needs from a parser (`OutputParser`, `HarmonyParser`)."""

    config: ParserConfig
    stopped_by: str | None
    tool_limit_reached: bool
    tool_calls_emitted: int

    @property
    def stopped(self) -> bool: ...

    @property
    def done(self) -> bool: ...

    def feed(self, text: str) -> list[ParsedEvent]: ...

    def finish(self) -> list[ParsedEvent]: ...


def output_parser(info: ModelInfo, config: ParserConfig) -> ModelOutputParser:
    """The parser for this model's output: harmony's channels, or markup inside text."""
    if info.dialect is not None and info.dialect.channels:
        return HarmonyParser(config)
    return OutputParser(config)
