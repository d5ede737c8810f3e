"""Gemma 4's tool-call notation as lark, built from the tools' JSON schemas.

Gemma 4 writes `call:NAME{key:value,…}` after `<|tool_call>`: JSON with bare keys (sorted, as
its template writes them) and strings in `<|"|>` quotes; numbers, booleans and null go through
`%json`, which prints them the same way. mlx-lm's `gemma4` parser reads it back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.call_grammars import (
    KEY_PATTERN,
    CallTool,
    LarkRules,
    bounded_text,
    int_or,
    joined,
    json_text,
    skip_or_refuse,
)
from mlxlaunch.engine.decoding.grammar import lark_literal, markup_symbol, text_without
from mlxlaunch.engine.decoding.schema_refs import as_schema, merge_all_of, parameters


def gemma4_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`call:NAME{key:value,…}` after `<|tool_call>` (its `<tool_call|>` is laid out by
    `tool_grammar`): nested objects and arrays in the same notation."""
    rules = LarkRules()
    notation = GemmaNotation(rules, markup_symbol(tokenizer, GEMMA_QUOTE))
    alternatives = [f"{lark_literal(f'call:{t.name}')} {notation.value(t.schema)}" for t in tools]
    rules.define("call", " | ".join(alternatives))
    return rules.text()


_BARE_KEY = re.compile(r"\w+")
GEMMA_QUOTE = '<|"|>'


class GemmaNotation:
    """Lark for values in Gemma 4's notation, built from JSON schemas. Exact for strings
    (enum, const, min/maxLength), numbers, booleans, null, objects with declared properties and
    arrays (items, min/maxItems); best effort elsewhere (`pattern` and `format` are not
    enforced, `allOf` is merged shallowly, undeclared properties of an object that also
    declares some are not offered)."""

    def __init__(self, rules: LarkRules, quote: str) -> None:
        self._rules = rules
        self._quote = quote
        self._any: str | None = None

    def value(self, schema: Any) -> str:
        if not isinstance(schema, dict) or not schema:
            return self.any()
        if "const" in schema:
            return self.literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(self.literal(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                base = {k: v for k, v in schema.items() if k != key}
                branches = [{**base, **b} if isinstance(b, dict) else b for b in schema[key]]
                return "(" + " | ".join(self.value(b) for b in branches) + ")"
        if isinstance(schema.get("allOf"), list):
            return self.value(merge_all_of(schema))
        declared = schema.get("type")
        if isinstance(declared, list):
            return "(" + " | ".join(self.value({**schema, "type": t}) for t in declared) + ")"
        if declared is None:
            if "properties" in schema or "additionalProperties" in schema:
                declared = "object"
            elif "items" in schema:
                declared = "array"
            else:
                return self.any()
        if declared == "string":
            text = self._rules.terminal(bounded_text(schema, GEMMA_QUOTE))
            return f"{self._quote} {text} {self._quote}"
        if declared in ("integer", "number", "boolean", "null"):
            return self._rules.json({k: v for k, v in schema.items() if k not in _CONTAINER_KEYS})
        if declared == "object":
            return self._object(schema)
        if declared == "array":
            return self._array(schema)
        return self.any()

    def literal(self, value: Any) -> str:
        """Lark for exactly this JSON value in the notation."""
        if isinstance(value, str):
            return (
                f"{self._quote} {lark_literal(value)} {self._quote}"
                if value
                else f"{self._quote} {self._quote}"
            )
        if isinstance(value, dict):
            items = [f"{lark_literal(k + ':')} {self.literal(v)}" for k, v in sorted(value.items())]
            return '"{" ' + ' "," '.join(items) + ' "}"'
        if isinstance(value, list):
            return '"[" ' + ' "," '.join(self.literal(v) for v in value) + ' "]"'
        return lark_literal(json_text(value))

    def any(self) -> str:
        """Any value (defined once per grammar; recursive)."""
        if self._any is None:
            self._any = "gemma_any"
            text = self._rules.terminal(text_without(GEMMA_QUOTE))
            key = self._rules.terminal(KEY_PATTERN)
            scalar = self._rules.json({"type": ["number", "boolean", "null"]})
            member = f'{key} ":" gemma_any'
            self._rules.define(
                self._any,
                f"{self._quote} {text} {self._quote} | {scalar}"
                f' | "{{" ({member} ("," {member})*)? "}}"'
                f' | "[" (gemma_any ("," gemma_any)*)? "]"',
            )
        return self._any

    def _object(self, schema: dict[str, Any]) -> str:
        props, required = parameters(schema)
        if not props:
            if schema.get("additionalProperties") is False:
                return '"{" "}"'
            extra = schema.get("additionalProperties")
            key = self._rules.terminal(KEY_PATTERN)
            member = self._rules.rule(f'{key} ":" {self.value(as_schema(extra))}')
            return f'"{{" ({member} ("," {member})*)? "}}"'
        items = []
        for name in sorted(props):
            if not _BARE_KEY.fullmatch(name):
                skip_or_refuse(name, required, "gemma4")
                continue
            items.append(
                (f"{lark_literal(name + ':')} {self.value(props[name])}", name in required)
            )
        return f'"{{" {joined(self._rules, items, lark_literal(","))} "}}"'

    def _array(self, schema: dict[str, Any]) -> str:
        item = self._rules.rule(self.value(schema.get("items")))
        low, high = int_or(schema.get("minItems"), 0), int_or(schema.get("maxItems"), None)
        if high is not None and high <= 0:
            return '"[" "]"'
        rest = f"{{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        body = f'{item} ("," {item}){rest}'
        return f'"[" {body if low > 0 else f"({body})?"} "]"'


_CONTAINER_KEYS = frozenset({"properties", "required", "items", "additionalProperties"})
