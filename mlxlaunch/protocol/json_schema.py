"""The shape of a JSON Schema a client sends (a tool's parameters, a response format), checked
the same way on every API before any model family reads it.

What reads a schema differs by family: llguidance compiles it when output is constrained, a
chat template renders it, a family's call reader types arguments by its `properties`. So a
schema whose keywords have the wrong shape (`"required": 5`, `"properties": [1, 2]`) was a
400 on one family and a 200 on another, where it reached the prompt as it was. Checked here,
at the wire, it is the same 400 naming the keyword on every family; what a keyword may hold
is JSON Schema's own rule (draft 2020-12, as Anthropic's API validates tool schemas), for the
keywords that shape the arguments. Other keywords and unknown ones pass as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator

from mlxlaunch.protocol.limits import shown

# Keywords whose value is one subschema, a list of them, or a map of names to them.
_ONE = ("additionalProperties", "items", "not", "contains", "propertyNames", "if", "then",
        "else", "unevaluatedItems", "unevaluatedProperties", "additionalItems")  # fmt: skip
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _type(value: Any) -> bool:
    if isinstance(value, str):
        return value in _TYPES
    return _strings(value) and all(item in _TYPES for item in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "required": (_strings, "must be a list of strings"),
    "type": (_type, f"must be one of {', '.join(sorted(_TYPES))}, or a list of them"),
    "enum": (lambda value: isinstance(value, list), "must be a list"),
    "pattern": (lambda value: isinstance(value, str), "must be a string"),
    **{key: (_count, "must be a non-negative integer") for key in _COUNTS},
    **{key: (_number, "must be a number") for key in _NUMBERS},
}


def schema_problem(schema: Any) -> str | None:
    """What is wrong with the shape of `schema`, as `path: problem`, or None."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return f"{path or 'schema'}: a schema must be an object or a boolean"
        for key, (holds, rule) in _RULES.items():
            if key in node and not holds(node[key]):
                return f"{_at(path, key)}: {rule} (not {shown(repr(node[key]), 40)})"
        for key in _ONE:
            if key in node:
                # `items` may still be draft-4's list of schemas.
                children = (
                    node[key] if key == "items" and isinstance(node[key], list) else [node[key]]
                )
                stack.extend((_at(path, key), child) for child in children)
        for key in _LISTS:
            if key in node:
                if not isinstance(node[key], list):
                    return f"{_at(path, key)}: must be a list of schemas"
                stack.extend((_at(path, f"{key}.{i}"), child) for i, child in enumerate(node[key]))
        for key in _MAPS:
            if key in node:
                if not isinstance(node[key], dict):
                    return f"{_at(path, key)}: must be an object of schemas"
                stack.extend((_at(path, f"{key}.{shown(name, 40)}"), child)
                             for name, child in node[key].items())  # fmt: skip
    return None


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _checked(schema: dict[str, Any]) -> dict[str, Any]:
    problem = schema_problem(schema)
    if problem is not None:
        raise ValueError(problem)
    return schema


# A JSON Schema object as the wire carries one: its shape checked (see the module docstring).
JsonSchema = Annotated[dict[str, Any], AfterValidator(_checked)]
