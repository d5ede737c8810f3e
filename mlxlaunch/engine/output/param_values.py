"""How parameter-style families turn a value's text into a value, one function per typing.

Each `ValueTyping` of `store/dialects.py` is one function here, converting a value's text by
the parameter's JSON schema the way mlx-lm's parser for the family does
(`mlx_lm/tool_parsers/<family>.py`); `engine/decoding/call_grammars.RAW_TEXT` is its other
half (which values the grammar writes as raw text). Where a streamed value cannot be taken
back, a value mlx-lm refuses (an integer parameter written "1.5") stays the text written.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable
from typing import Any

from mlxlaunch.store.dialects import ValueTyping

# A parameter's value from (its text, what the markup says of its type: DSML's string="true"
# or "false", else None, its schema: None when the tool does not declare it).
ValueReader = Callable[[str, str | None, Any], Any]


_QWEN_STRING = {"string", "str", "text", "varchar", "char", "enum"}
_QWEN_BOOL = {"boolean", "bool", "binary"}
_QWEN_INT = ("int", "uint", "long", "short", "unsigned")


def _qwen3_value(text: str, hint: str | None, schema: Any) -> Any:
    """Qwen3-Coder: by the schema's `type` name; no type: a JSON object or array, else text."""
    kind = _first_type(schema.get("type")) if isinstance(schema, dict) else None
    if text.lower() == "null" and kind not in _QWEN_STRING:
        return None
    if not isinstance(schema, dict) or not schema:
        return text
    if "type" not in schema:
        return _json_container(text) or text
    if kind is None or kind in _QWEN_STRING:
        return text
    if kind.startswith(_QWEN_INT):
        return _number(text, integer=True)
    if kind.startswith(("num", "float")):
        return _number(text, integer=False)
    if kind in _QWEN_BOOL:
        return text.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        return _container(text)
    return text


_MINIMAX_ORDER = ("integer", "int", "number", "float", "boolean", "bool", "object", "array")
_MINIMAX_STRING = {"string", "str", "text"}
_MINIMAX_TRUE = {"true", "1", "yes", "on"}
_MINIMAX_FALSE = {"false", "0", "no", "off"}


def _minimax_value(text: str, hint: str | None, schema: Any) -> Any:
    """MiniMax-M2: the first of the schema's types (integer, number, boolean, object/array,
    string: in that order) the text reads as; undeclared parameters are text."""
    types = {t.lower() for t in _schema_types(schema)} or {"string"}
    is_string = bool(types & _MINIMAX_STRING)
    if text.lower() == "null" and not is_string:
        return None
    if "null" in types and text.lower() in ("none", "nil"):
        return None
    for kind in _MINIMAX_ORDER:
        if kind not in types:
            continue
        if kind in ("integer", "int"):
            value = _number(text, integer=True)
        elif kind in ("number", "float"):
            value = _number(text, integer=False)
        elif kind in ("boolean", "bool"):
            word = text.lower().strip()
            value = True if word in _MINIMAX_TRUE else False if word in _MINIMAX_FALSE else text
        else:
            value = _container(text)
        if value is not text:
            return value
    if is_string or not types & set(_MINIMAX_ORDER):
        return text
    return json_or(text, text)


_KNOWN_TYPES = {"string", "integer", "number", "boolean", "object", "array", "null"}


def _glm_value(text: str, hint: str | None, schema: Any) -> Any:
    """GLM and LongCat: string parameters are text; any other is read as JSON or a Python
    literal when it is one."""
    types = _schema_types(schema) if isinstance(schema, dict) and "type" in schema else []
    if "string" in types or (types and not set(types) & _KNOWN_TYPES):
        return text
    return _literal(text)


def _dsml_value(text: str, hint: str | None, schema: Any) -> Any:
    """DeepSeek-V3.2: string="true" is text, string="false" a JSON value."""
    if hint == "true":
        return text
    if hint is None:
        types = set(_schema_types(schema))
        if "string" in types or not types & _KNOWN_TYPES:
            return text  # undeclared, a string, or a type we do not know
    return json_or(text, text)


def _first_type(declared: Any) -> str | None:
    """The type a Qwen3-Coder parameter is read as: its `type`, or the first non-null one."""
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), None)
    return str(declared).strip().lower() if declared is not None else None


def _schema_types(schema: Any) -> list[str]:
    """Every type a parameter's schema allows: its `type` (a name or a list), the types of its
    `enum` values, and those of anyOf/oneOf/allOf branches; [] when it names none."""
    if not isinstance(schema, dict):
        return []
    types: list[str] = []
    declared = schema.get("type")
    for kind in declared if isinstance(declared, list) else [declared]:
        if isinstance(kind, str):
            types.append(kind)
    enum = schema.get("enum")
    if isinstance(enum, list):
        types += [_JSON_TYPES.get(type(value), "string") for value in enum]
    for branch in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(branch)
        if isinstance(choices, list):
            for choice in choices:
                types += _schema_types(choice)
    return types


_JSON_TYPES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    list: "array",
    dict: "object",
}


def _number(text: str, *, integer: bool) -> Any:
    """An integer (or, unless `integer`, a float) when the text is one, else the text itself."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    if number.is_integer():
        return int(number)
    return text if integer else number


def json_or(text: str, otherwise: Any) -> Any:
    try:
        return json.loads(text, strict=False)
    except (ValueError, RecursionError):  # not JSON, an integer past int(), too deep
        return otherwise


def _json_container(text: str) -> dict[str, Any] | list[Any] | None:
    value = json_or(text, None)
    return value if isinstance(value, dict | list) else None


def _container(text: str) -> Any:
    """An object or array written as JSON or as a Python literal, else the text itself."""
    value = json_or(text, text)
    if value is text:
        value = _python_literal(text)
    return value


def _literal(text: str) -> Any:
    """A JSON value, else a Python literal, else the text (GLM's `_deserialize`)."""
    value = json_or(text, text)
    return _python_literal(text) if value is text else value


def _python_literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except Exception:  # model output: any failure (syntax, depth, memory) means "not one"
        return text


def _json_value(text: str, hint: str | None, schema: Any) -> Any:
    """Every value JSON (Muse Spark's parser decodes each one first); else the text."""
    return json_or(text, text)


# Each typing of `store.dialects.ValueTyping`, as the reader applies it.
VALUE_READERS: dict[ValueTyping, ValueReader] = {
    "qwen3_coder": _qwen3_value,
    "glm": _glm_value,
    "minimax": _minimax_value,
    "dsml": _dsml_value,
    "json": _json_value,
}
