"""Tool-call grammars generated from a family's record: lark rules for one call.

`envelope_call` and `params_call` build the rules defining `call` (one call of any of the given
tools, as it follows the family's opening marker) from the family's `JsonEnvelope` or
`ParamElements` record in `store/dialects.py`, the record its streaming reader downstream is
generated from too; `pythonic_call` and `gemma_notation.gemma4_call` build the two notations
of their own, read by mlx-lm's parsers. `tool_grammar` lays the calls out in the output.
Arguments come in three shapes:

- JSON (json_tools, llama3_json, kimi_k2, mistral, deepseek_v31, pythonic): one `%json` rule per
  tool, or one per parameter (pythonic's keyword values are JSON literals);
- parameters (qwen3_coder, glm47, longcat, minimax_m2, minicpm5, deepseek_v32, muse_spark): one
  element per parameter, required ones first, then optional ones, each in schema order. A value
  is raw text where the family's parser keeps text as is (string types, decided from the schema
  as the client sent it, since that is what the parser reads: `RAW_TEXT`) and JSON otherwise;
- Gemma 4's notation (gemma4): see `gemma_notation`.

llguidance's lexer is greedy: a free-text lexeme followed by a closing *literal* never ends,
because every prefix of the closer still extends the text ("ls\\n</parameter" is valid text, so
">" fails). Raw text therefore ends either at a single-token closer (a token cannot extend a
byte lexeme) or inside a `[lazy]` rule that holds the text and its closer as one lexeme.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar import json_rule, lark_literal, markup_symbol, text_without
from mlxlaunch.engine.decoding.input_grammar import input_rules
from mlxlaunch.engine.decoding.schema_refs import (
    allows_undeclared,
    as_schema,
    declared_types,
    inline_refs,
    never_string,
    parameters,
    required_first,
    string_only,
)
from mlxlaunch.engine.types import (
    FREEFORM_INPUT,
    InputGrammar,
    InvalidRequest,
    ToolChoice,
    ToolSpec,
)
from mlxlaunch.store.dialects import IdStyle, JsonEnvelope, ParamElements, ValueTyping

ANY_OBJECT: dict[str, Any] = {"type": "object"}
# A parameter name in an open object (a tool without declared parameters).
KEY_PATTERN = "/[A-Za-z_][A-Za-z0-9_.-]{0,63}/"
# String bounds above this are not worth a counted regex (no output gets that long).
MAX_COUNTED_LENGTH = 8192


@dataclass(frozen=True)
class CallTool:
    """One tool as a grammar sees it.

    Attributes:
        name: the tool's name.
        schema: what its arguments must match (local `$ref`s inlined).
        sent: the schema as the client sent it, which is what a family's parser reads argument
            types from (None: the same as `schema`).
        grammar: a freeform tool's grammar, which its one string parameter follows (the
            families that write JSON or raw text; Gemma's and Harmony's notations take the
            string as their schema says).
    """

    name: str
    schema: dict[str, Any]
    sent: dict[str, Any] | None = None
    grammar: InputGrammar | None = None

    @property
    def declared(self) -> dict[str, Any]:
        """The schema a parser reads types from."""
        return self.sent if self.sent is not None else self.schema


class LarkRules:
    """Lark rules under construction, each with a fresh name."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._count = 0

    def rule(self, body: str, *, lazy: bool = False) -> str:
        """A new rule with this body; returns its name."""
        self._count += 1
        name = f"r{self._count}"
        self._lines.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def terminal(self, body: str) -> str:
        """A new terminal (a lexeme) with this body; returns its name."""
        self._count += 1
        name = f"T{self._count}"
        self._lines.append(f"{name}: {body}")
        return name

    def json(self, schema: dict[str, Any]) -> str:
        """A new rule for one JSON value matching `schema`; returns its name."""
        return self.rule(json_rule(schema))

    def input_text(self, grammar: InputGrammar, *, escaped: bool) -> str:
        """The rules of a freeform tool's input grammar (its characters as a JSON string
        writes them when `escaped`); returns the name of its top rule."""
        self._count += 1
        rules = input_rules(grammar, f"g{self._count}", escaped=escaped)
        self._lines.append(rules.text.rstrip("\n"))
        return rules.start

    def json_string(self, grammar: InputGrammar) -> str:
        """A JSON string whose text follows `grammar`."""
        quote = lark_literal('"')
        return f"{quote} {self.input_text(grammar, escaped=True)} {quote}"

    def define(self, name: str, body: str) -> None:
        """A rule with a given name (`call`, or one referenced before it exists)."""
        self._lines.append(f"{name}: {body}")

    def text(self) -> str:
        """The rules as lark text."""
        return "\n".join(self._lines) + "\n"


def constrained_tools(
    tools: Sequence[ToolSpec], choice: ToolChoice, *, inline: bool = True
) -> list[CallTool] | None:
    """The tools a tool-call constraint is built for, or None when the choice needs none
    ("none", or "auto" without strict tools): the named one for "tool", else all; forced or
    strict ones with their schema (`argument_schema`), the others taking any object.

    Raises:
        InvalidRequest: the choice names a tool that is not offered, or calls for a tool
            without tools.
    """
    forced = choice.mode in ("any", "tool")
    if choice.mode == "none" or not (forced or any(t.strict for t in tools)):
        return None
    if not tools:
        raise InvalidRequest(f"tool_choice {choice.wire or choice.mode!r} needs at least one tool")
    offered = list(tools)
    if choice.mode == "tool":
        offered = [t for t in tools if t.name == choice.name]
        if not offered:
            raise InvalidRequest(f"tool_choice names tool {choice.name!r}, which is not offered")
    return [
        CallTool(
            t.name,
            argument_schema(t.parameters, inline=inline) if forced or t.strict else ANY_OBJECT,
            t.parameters,
            t.grammar if forced or t.strict else None,
        )
        for t in offered
    ]


def argument_schema(schema: dict[str, Any], *, inline: bool = True) -> dict[str, Any]:
    """A tool's input schema as a grammar takes it: an object, whatever the client sent, with
    its local `$ref`s inlined (unless not `inline`: a grammar that keeps each schema whole)."""
    if not isinstance(schema, dict) or not schema:
        return ANY_OBJECT
    cleaned = {k: v for k, v in schema.items() if k != "$schema"}
    cleaned.setdefault("type", "object")
    return inline_refs(cleaned) if inline else cleaned


# --- JSON arguments ---------------------------------------------------------------------------


def envelope_call(
    tokenizer: TokenizerWrapper,
    tools: Sequence[CallTool],
    envelope: JsonEnvelope,
    id_style: IdStyle = "any",
) -> str:
    """Rules defining `call` for a `JsonEnvelope` family: a named object
    (`{"name": "<tool>", "arguments": {...}}`, one `%json` for all tools), or the name between
    the envelope's markers, then the arguments (with Kimi's `functions.NAME:INDEX` and
    Mistral's `[CALL_ID]<9 alphanumerics>` where the id style asks for them)."""
    rules = LarkRules()
    if envelope.named_object is not None:
        if any(t.grammar is not None for t in tools):
            body = _named_alternatives(rules, tools, envelope.named_object)
        else:
            body = rules.json(_named_object(tools, envelope.named_object))
        rules.define("call", _spaced(_literal(envelope.lead), body, _literal(envelope.trail)))
        return rules.text()
    symbol = functools.partial(_marker, tokenizer)
    arguments = symbol(envelope.arguments_open)
    if id_style == "alnum9" and envelope.call_id:
        arguments = _spaced(symbol(envelope.call_id), rules.terminal("/[A-Za-z0-9]{9}/"), arguments)
    if id_style == "functions_index":
        index = rules.terminal("/[0-9]{1,6}/")
        names = [f"{lark_literal(f'functions.{t.name}:')} {index}" for t in tools]
    else:
        names = [lark_literal(t.name) for t in tools]
    alternatives = [
        f"{name} {arguments} {_json_arguments(rules, t)}"
        for name, t in zip(names, tools, strict=True)
    ]
    calls = f"({' | '.join(alternatives)})"
    rules.define("call", _spaced(symbol(envelope.call_open), calls, symbol(envelope.call_close)))
    return rules.text()


def _named_object(tools: Sequence[CallTool], arguments: str) -> dict[str, Any]:
    bodies = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, arguments: tool.schema},
            "required": ["name", arguments],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    # One %json with anyOf: llguidance picks the branch from the name, so no ambiguity.
    return bodies[0] if len(bodies) == 1 else {"anyOf": bodies}


def _json_arguments(rules: LarkRules, tool: CallTool) -> str:
    """A tool's arguments object: its schema's, or a freeform tool's one string in its
    grammar (written as `json.dumps` writes the object, as the %json options do)."""
    if tool.grammar is None:
        return rules.json(tool.schema)
    key = lark_literal("{" + json_text(FREEFORM_INPUT) + ": ")
    return f"{key} {rules.json_string(tool.grammar)} {lark_literal('}')}"


def _named_alternatives(rules: LarkRules, tools: Sequence[CallTool], arguments: str) -> str:
    """A named object written out, `{"name": "<tool>", "<arguments>": {...}}`, one branch per
    tool: a freeform tool's arguments are no %json (llguidance takes no %json branch beside a
    literal one that starts alike), so the name is a literal for every tool."""
    branches = []
    for tool in tools:
        head = lark_literal(f"{json_text(tool.name)[1:]}, {json_text(arguments)}: ")
        branches.append(f"{head} {_json_arguments(rules, tool)}")
    opening, closing = lark_literal('{"name": "'), lark_literal("}")
    return rules.rule(f"{opening} ({' | '.join(branches)}) {closing}")


def pythonic_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool>(key=value, ...)`, calls comma-separated in one `<|tool_call_start|>[...]
    <|tool_call_end|>` section (LFM2); values are JSON literals, which Python reads too."""
    del tokenizer
    rules = LarkRules()
    alternatives = []
    for tool in tools:
        props, required = parameters(tool.schema)
        items = []
        for name in required_first(props, required):
            if not name.isidentifier():
                skip_or_refuse(name, required, "pythonic")
                continue
            value = _grammar_or_json(rules, tool, name, props[name])
            items.append((f"{lark_literal(name + '=')} {value}", name in required))
        if not props and allows_undeclared(tool.schema):
            key = rules.terminal(KEY_PATTERN)
            item = rules.rule(f'{key} "=" {rules.json({})}')
            arguments = f'({item} (", " {item})*)?'
        else:
            arguments = joined(rules, items, '", "')
        alternatives.append(f'{lark_literal(tool.name + "(")} {arguments} ")"')
    rules.define("call", " | ".join(alternatives))
    return rules.text()


# --- parameters, one element each -------------------------------------------------------------


# How each `ValueTyping` decides that a parameter's value is raw text (from its schema as sent
# and as resolved); `engine/output/param_values.VALUE_READERS` is the reader's half.
RawText = Callable[[dict[str, Any], dict[str, Any]], bool]


def params_call(
    tokenizer: TokenizerWrapper, tools: Sequence[CallTool], elements: ParamElements
) -> str:
    """Rules defining `call` for a `ParamElements` family, as its record spells it: required
    parameters first, then the optional ones, each in schema order; a tool without declared
    parameters (and whose schema allows others) takes any number of named raw-text parameters.
    A value is raw text where the family's parser keeps text as is (`RAW_TEXT`), JSON
    otherwise."""
    rules = LarkRules()
    close = elements.pad + elements.value_close
    end = markup_symbol(tokenizer, close)
    gap = _optional(elements.gap, elements.gap_optional)
    quote = '"' if elements.quoted else ""
    raw_text = RAW_TEXT[elements.values]

    def tag(text: str) -> str:
        return markup_symbol(tokenizer, text) if elements.tag_tokens else lark_literal(text)

    def opening(name: str, raw: bool) -> str:
        attribute = f' string="{str(raw).lower()}"' if elements.string_attribute else ""
        parts = [tag(elements.param_open), _literal(quote), name]
        parts += [_literal(quote + attribute), tag(elements.key_close)]
        if elements.value_open:
            parts += [gap, tag(elements.value_open)]
        return _spaced(*parts, _literal(elements.pad))

    alternatives = []
    for tool in tools:
        props, required = parameters(tool.schema)
        sent, _ = parameters(tool.declared)
        parts = []
        for name in required_first(props, required):
            raw = raw_text(as_schema(sent.get(name)), props[name])
            grammar = tool.grammar if name == FREEFORM_INPUT else None
            if grammar is not None:
                text = rules.input_text(grammar, escaped=False) if raw else None
                value = f"{text or rules.json_string(grammar)} {end}"
            elif raw:
                value = _raw_value(rules, props[name], close, end)
            elif elements.python_booleans and props[name].get("type") == "boolean":
                value = f'("true" | "false" | "True" | "False") {end}'
            else:
                value = f"{_json_or_plain(rules, props[name])} {end}"
            param = rules.rule(_spaced(opening(lark_literal(name), raw), value, gap))
            parts.append(param if name in required else f"{param}?")
        if not props and allows_undeclared(tool.schema):
            value = _raw_value(rules, {}, close, end)
            key = rules.terminal(KEY_PATTERN)
            parts.append(rules.rule(_spaced(opening(key, True), value, gap)) + "*")
        head = (elements.call_open or "") + quote + tool.name + quote + elements.name_close
        tail = _spaced(_literal(elements.call_close or ""), gap) if elements.call_close else ""
        alternatives.append(_spaced(lark_literal(elements.lead + head), gap, *parts, tail))
    rules.define("call", " | ".join(alternatives))
    return rules.text()


_QWEN_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})


def _qwen3_coder_raw(sent: dict[str, Any], resolved: dict[str, Any]) -> bool:
    """mlx-lm's qwen3_coder parser keeps text for string types; an untyped parameter is
    JSON-decoded only when that gives an object or array."""
    if "type" in sent:
        return str(sent["type"]).strip().lower() in _QWEN_STRING_TYPES
    return resolved.get("type") not in ("object", "array")


def _minimax_raw(sent: dict[str, Any], resolved: dict[str, Any]) -> bool:
    """mlx-lm's minimax parser returns the text as is once "string" is among the types it finds
    in the schema (type, enum values, anyOf/oneOf/allOf), and finds "string" when none."""
    return bool(declared_types(sent) & {"string", "str", "text"})


RAW_TEXT: dict[ValueTyping, RawText] = {
    "qwen3_coder": _qwen3_coder_raw,
    # mlx-lm keeps a value as text when the property's type is exactly "string".
    "glm": lambda sent, resolved: sent.get("type") == "string",
    "minimax": _minimax_raw,
    # DSML says which values are strings: those whose schema allows nothing else.
    "dsml": lambda sent, resolved: string_only(resolved),
    "json": lambda sent, resolved: False,
}


def _grammar_or_json(rules: LarkRules, tool: CallTool, name: str, schema: dict[str, Any]) -> str:
    """A parameter's JSON value: a freeform tool's input in its grammar, else the schema's."""
    if tool.grammar is not None and name == FREEFORM_INPUT:
        return rules.json_string(tool.grammar)
    return rules.json(schema)


def _json_or_plain(rules: LarkRules, schema: dict[str, Any]) -> str:
    """A JSON value; for an enumeration of strings, also each string bare where the parser's
    fallbacks (JSON, then Python literal, then the text itself) read it back unchanged, as
    templates write strings bare (GLM's, for an enum behind a `$ref` the parser cannot type)."""
    literals = _raw_literals(schema) if string_only(schema) else None
    bare = [v for v in literals or [] if _stays_text(v)]
    if not bare or len(bare) != len(literals or []):
        return rules.json(schema)
    return f"({rules.json(schema)} | {' | '.join(lark_literal(v) for v in bare)})"


def _stays_text(text: str) -> bool:
    if not text or text.strip() != text:
        return False
    for decode in (json.loads, ast.literal_eval):
        try:
            decode(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            continue
        return False
    return True


def _raw_value(rules: LarkRules, schema: dict[str, Any], close: str, end: str) -> str:
    """A value written as raw text, with the text (or token) that ends it."""
    literals = _raw_literals(schema)
    if literals is not None:
        return f"({' | '.join(lark_literal(v) for v in literals)}) {end}"
    if string_only(schema):
        text = rules.terminal(bounded_text(schema, close))
    elif never_string(schema):
        return f"{rules.json(schema)} {end}"  # the JSON text is the best raw text there is
    else:
        text = rules.terminal(text_without(close))
    if end.startswith("<["):
        return f"{text} {end}"  # a token ends the text lexeme
    return rules.rule(f"{text} {end}", lazy=True)  # one lexeme, ended at the first closer


def _raw_literals(schema: dict[str, Any]) -> list[str] | None:
    """The texts of an enum or const, as a raw value writes them (None: not an enumeration)."""
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema.get("enum"), list) and schema["enum"]:
        values = schema["enum"]
    else:
        return None
    return [v if isinstance(v, str) else json_text(v) for v in values]


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def bounded_text(schema: dict[str, Any], close: str) -> str:
    """Text without `close`, within the schema's min/maxLength (bounds past
    `MAX_COUNTED_LENGTH` are dropped)."""
    low, high = int_or(schema.get("minLength"), 0), int_or(schema.get("maxLength"), None)
    low = low if low <= MAX_COUNTED_LENGTH else 0
    high = high if high is not None and high <= MAX_COUNTED_LENGTH else None
    if not low and high is None:
        return text_without(close)
    return f"/(?s:.{{{low},{'' if high is None else high}}})/ & {text_without(close)}"


def int_or(value: Any, default: int | None) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# --- shared pieces -----------------------------------------------------------------------------


def skip_or_refuse(name: str, required: list[str], family: str) -> None:
    """A property name the family's notation cannot write: left out when optional."""
    if name in required:
        raise InvalidRequest(f"the {family} tool-call format cannot write the parameter {name!r}")


def _marker(tokenizer: TokenizerWrapper, text: str) -> str:
    """A marker's symbol (see `markup_symbol`); "" for no marker."""
    return markup_symbol(tokenizer, text) if text else ""


def _literal(text: str) -> str:
    return lark_literal(text) if text else ""


def _optional(text: str, optional: bool) -> str:
    """Lark for `text`, which may be left out when `optional`."""
    return f"{lark_literal(text)}?" if text and optional else _literal(text)


def _spaced(*parts: str) -> str:
    """Lark parts in sequence, leaving out the empty ones."""
    return " ".join(p for p in parts if p)


def joined(rules: LarkRules, items: list[tuple[str, bool]], separator: str) -> str:
    """Lark for `items` in order, joined by `separator`; optional items (flag False) may be
    left out. Built from the end: `head` is the rest when nothing precedes it, `tail` when
    something does (so it starts with the separator)."""
    head = tail = '""'
    for expr, required in reversed(items):
        if required:
            head, tail = rules.rule(f"{expr} {tail}"), rules.rule(f"{separator} {expr} {tail}")
        else:
            head, tail = (
                rules.rule(f"{expr} {tail} | {head}"),
                rules.rule(f"{separator} {expr} {tail} | {tail}"),
            )
    return head
