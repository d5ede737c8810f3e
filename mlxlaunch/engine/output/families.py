"""Which span reader reads a family's tool calls.

Our own readers stream the arguments while the model writes them, generated from the family's
record (`store/dialects.py`, the one its constraint grammar is built from): JSON arguments
character by character (`json_readers`, a `JsonEnvelope`), parameter-per-element formats one
finished parameter at a time (`param_readers`, a `ParamElements`). Families without one fall
back to mlx-lm's parser over the whole span.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxlaunch.engine.output.json_readers import json_reader, json_value_calls
from mlxlaunch.engine.output.param_readers import param_reader
from mlxlaunch.engine.output.spans import BufferedReader, SpanReaderFactory
from mlxlaunch.engine.types import ToolSpec
from mlxlaunch.store.dialects import LEARNED_JSON, Dialect, ParamElements


def span_reader_for(dialect: Dialect, tools: Sequence[ToolSpec]) -> SpanReaderFactory | None:
    """The streaming reader for `dialect`'s spans, or None (use mlx-lm's parser)."""
    if dialect.name == LEARNED_JSON.name:  # a template's own markup: JSON calls, read whole
        return lambda: BufferedReader(json_value_calls)
    if isinstance(dialect.markup, ParamElements):
        return param_reader(dialect.markup, list(tools)) if dialect.markup.streamed else None
    return json_reader(dialect)
