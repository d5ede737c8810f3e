"""Per-family tool-call grammars: lark rules for one call in each model family's own markup.

Each `*_call` builder returns lark rules defining `call`, one call of any of the given tools
as it follows the family's opening marker; `tool_grammar.CALL_GRAMMARS` says which builder a
dialect uses and how its calls are opened, separated and grouped.

What each family's grammar writes is what its reader downstream reads back: mlx-lm's parser of
that name, or ours where mlx-lm has none (their formats are in each builder's docstring).
Arguments come in three shapes:

- JSON (json_tools, llama3_json, kimi_k2, mistral, deepseek_v31, pythonic): one `%json` rule per
  tool, or one per parameter (pythonic's keyword values are JSON literals);
- parameters (qwen3_coder, glm47, longcat, minimax_m2, minicpm5, deepseek_v32, muse_spark): one
  element per parameter, required ones first, then optional ones, each in schema order. A value
  is raw text where the family's parser keeps text as is (string types, decided from the schema
  as the client sent it, since that is what the parser reads) and JSON otherwise;
- Gemma 4's notation (gemma4): JSON with bare keys and strings in `<|"|>` quotes, built from the
  schema here (numbers, booleans and null through `%json`, which prints them the same way).

llguidance's lexer is greedy: a free-text lexeme followed by a closing *literal* never ends,
because every prefix of the closer still extends the text ("ls\\n</parameter" is valid text, so
">" fails). Raw text therefore ends either at a single-token closer (a token cannot extend a
byte lexeme) or inside a `[lazy]` rule that holds the text and its closer as one lexeme.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar import json_rule, lark_literal, markup_symbol
from mlxlaunch.engine.decoding.schema_refs import (
    allows_undeclared,
    as_schema,
    declared_types,
    merge_all_of,
    never_string,
    parameters,
    required_first,
    string_only,
)
from mlxlaunch.engine.types import InvalidRequest

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
    """

    name: str
    schema: dict[str, Any]
    sent: dict[str, Any] | None = None

    @property
    def declared(self) -> dict[str, Any]:
        """The schema a parser reads types from."""
        return self.sent if self.sent is not None else self.schema


# A builder returns lark rules that define `call`: one call of any of `tools`, as it follows
# the family's opener (see `tool_grammar.CallSyntax`).
CallGrammar = Callable[[TokenizerWrapper, Sequence[CallTool]], str]


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

    def define(self, name: str, body: str) -> None:
        """A rule with a given name (`call`, or one referenced before it exists)."""
        self._lines.append(f"{name}: {body}")

    def text(self) -> str:
        """The rules as lark text."""
        return "\n".join(self._lines) + "\n"


# --- JSON arguments ---------------------------------------------------------------------------


def json_tools_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>` (Qwen, Hermes)."""
    rules = LarkRules()
    body = _named_object(tools, "arguments")
    rules.define(
        "call", f'"\\n" {rules.json(body)} "\\n" {markup_symbol(tokenizer, "</tool_call>")}'
    )
    return rules.text()


def llama3_json_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`{"name": "<tool>", "parameters": {...}}` as the whole output (Llama 3.x; the Llama 3.3
    template renders calls without `<|python_tag|>`)."""
    del tokenizer
    rules = LarkRules()
    rules.define("call", rules.json(_named_object(tools, "parameters")))
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


def kimi_k2_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<|tool_call_begin|>functions.<tool>:<index><|tool_call_argument_begin|>{...}
    <|tool_call_end|>`, several in one `<|tool_calls_section_begin|>` section."""
    rules = LarkRules()
    index = rules.terminal("/[0-9]{1,6}/")
    arguments = markup_symbol(tokenizer, "<|tool_call_argument_begin|>")
    alternatives = [
        f"{lark_literal(f'functions.{t.name}:')} {index} {arguments} {rules.json(t.schema)}"
        for t in tools
    ]
    begin = markup_symbol(tokenizer, "<|tool_call_begin|>")
    end = markup_symbol(tokenizer, "<|tool_call_end|>")
    rules.define("call", f"{begin} ({' | '.join(alternatives)}) {end}")
    return rules.text()


def mistral_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`[TOOL_CALLS]<tool>[ARGS]{...}`; no end marker (the output ends), and each parallel call
    opens with its own `[TOOL_CALLS]` (Devstral, Ministral 3, Mistral Small 3.1)."""
    return _mistral(tokenizer, tools, call_ids=False)


def mistral_call_with_ids(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`[TOOL_CALLS]<tool>[CALL_ID]<9 alphanumerics>[ARGS]{...}` (Mistral Small 3.2, whose
    template checks the id's form)."""
    return _mistral(tokenizer, tools, call_ids=True)


def _mistral(tokenizer: TokenizerWrapper, tools: Sequence[CallTool], *, call_ids: bool) -> str:
    rules = LarkRules()
    args = markup_symbol(tokenizer, "[ARGS]")
    if call_ids:
        args = (
            f"{markup_symbol(tokenizer, '[CALL_ID]')} {rules.terminal('/[A-Za-z0-9]{9}/')} {args}"
        )
    alternatives = [f"{lark_literal(t.name)} {args} {rules.json(t.schema)}" for t in tools]
    rules.define("call", " | ".join(alternatives))
    return rules.text()


def deepseek_v31_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<｜tool▁call▁begin｜><tool><｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, several in one
    `<｜tool▁calls▁begin｜>` section (DeepSeek V3.1)."""
    rules = LarkRules()
    sep = markup_symbol(tokenizer, "<｜tool▁sep｜>")
    alternatives = [f"{lark_literal(t.name)} {sep} {rules.json(t.schema)}" for t in tools]
    begin = markup_symbol(tokenizer, "<｜tool▁call▁begin｜>")
    end = markup_symbol(tokenizer, "<｜tool▁call▁end｜>")
    rules.define("call", f"{begin} ({' | '.join(alternatives)}) {end}")
    return rules.text()


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
                _skip_or_refuse(name, required, "pythonic")
                continue
            items.append(
                (f"{lark_literal(name + '=')} {rules.json(props[name])}", name in required)
            )
        if not props and allows_undeclared(tool.schema):
            key = rules.terminal(KEY_PATTERN)
            item = rules.rule(f'{key} "=" {rules.json({})}')
            arguments = f'({item} (", " {item})*)?'
        else:
            arguments = _joined(rules, items, '", "')
        alternatives.append(f'{lark_literal(tool.name + "(")} {arguments} ")"')
    rules.define("call", " | ".join(alternatives))
    return rules.text()


# --- parameters, one element each -------------------------------------------------------------


@dataclass(frozen=True)
class ParamMarkup:
    """How a parameters family writes one call.

    Attributes:
        head: lark opening a call of the named tool (after the family's opener).
        tail: lark closing the call.
        open: lark opening one parameter, given the lark of its name and whether its value
            is raw text.
        close: the text that ends a value (single token or not).
        after_close: lark following `close`.
        raw: whether the parser keeps a value as raw text, from the parameter's schema as sent
            and as resolved.
        python_booleans: booleans may also be written True/False (a template that renders
            values with Jinja's `string` filter writes Python's spelling; the parser reads both).
    """

    head: Callable[[str], str]
    tail: str
    open: Callable[[str, bool], str]
    close: str
    after_close: str
    raw: Callable[[dict[str, Any], dict[str, Any]], bool]
    tokenizer: TokenizerWrapper = field(repr=False)
    python_booleans: bool = False


def params_call(tools: Sequence[CallTool], markup: ParamMarkup) -> str:
    """Rules defining `call` for a parameters family: required parameters first, then the
    optional ones, each in schema order; a tool without declared parameters (and whose schema
    allows others) takes any number of named raw-text parameters."""
    rules = LarkRules()
    end = markup_symbol(markup.tokenizer, markup.close)
    alternatives = []
    for tool in tools:
        props, required = parameters(tool.schema)
        sent, _ = parameters(tool.declared)
        parts = []
        for name in required_first(props, required):
            raw = markup.raw(as_schema(sent.get(name)), props[name])
            if raw:
                value = _raw_value(rules, props[name], markup.close, end)
            elif markup.python_booleans and props[name].get("type") == "boolean":
                value = f'("true" | "false" | "True" | "False") {end}'
            else:
                value = f"{_json_or_plain(rules, props[name])} {end}"
            param = rules.rule(
                f"{markup.open(lark_literal(name), raw)} {value} {markup.after_close}"
            )
            parts.append(param if name in required else f"{param}?")
        if not props and allows_undeclared(tool.schema):
            value = _raw_value(rules, {}, markup.close, end)
            key = rules.terminal(KEY_PATTERN)
            parts.append(rules.rule(f"{markup.open(key, True)} {value} {markup.after_close}") + "*")
        alternatives.append(f"{markup.head(tool.name)} {' '.join(parts)} {markup.tail}")
    rules.define("call", " | ".join(alternatives))
    return rules.text()


def qwen3_coder_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>
    \\n</tool_call>` (Qwen3-Coder)."""
    end = markup_symbol(tokenizer, "</tool_call>")
    markup = ParamMarkup(
        head=lambda name: lark_literal(f"\n<function={name}>\n"),
        tail=f'"</function>\\n" {end}',
        open=lambda name, raw: f'"<parameter=" {name} ">\\n"',
        close="\n</parameter>",
        after_close='"\\n"',
        raw=_qwen3_coder_raw,
        tokenizer=tokenizer,
        python_booleans=True,  # Qwen3-Coder's template writes `value | string`: True, False
    )
    return params_call(tools, markup)


def glm47_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>`
    (GLM 4.5/4.6; GLM 4.7 drops the newlines, so they are optional)."""
    return _arg_key_call(tokenizer, tools, "")


def longcat_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """GLM's markup with `longcat_` tags: `<longcat_tool_call>NAME\\n<longcat_arg_key>K
    </longcat_arg_key>\\n<longcat_arg_value>V</longcat_arg_value>\\n…</longcat_tool_call>`."""
    return _arg_key_call(tokenizer, tools, "longcat_")


def _arg_key_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool], prefix: str) -> str:
    def tag(name: str) -> str:
        return markup_symbol(tokenizer, name.replace("NS", prefix))

    key, key_end, value = tag("<NSarg_key>"), tag("</NSarg_key>"), tag("<NSarg_value>")
    markup = ParamMarkup(
        head=lambda name: f'{lark_literal(name)} "\\n"?',
        tail=tag("</NStool_call>"),
        open=lambda name, raw: f'{key} {name} {key_end} "\\n"? {value}',
        close=f"</{prefix}arg_value>",
        after_close='"\\n"?',
        # mlx-lm keeps a value as text when the property's type is exactly "string".
        raw=lambda sent, resolved: sent.get("type") == "string",
        tokenizer=tokenizer,
    )
    return params_call(tools, markup)


def minimax_m2_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n…</invoke>\\n`, several in
    one `<minimax:tool_call>\\n … </minimax:tool_call>` section (MiniMax M2)."""
    markup = ParamMarkup(
        head=lambda name: lark_literal(f'<invoke name="{name}">\n'),
        tail='"</invoke>\\n"',
        open=lambda name, raw: f'"<parameter name=\\"" {name} "\\">"',
        close="</parameter>",
        after_close='"\\n"',
        raw=_minimax_raw,
        tokenizer=tokenizer,
    )
    return params_call(tools, markup)


def minicpm5_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<function name="NAME"><param name="K">V</param>…</function>`, parallel calls one after
    another (MiniCPM5); values typed as MiniMax's parser types them."""
    markup = ParamMarkup(
        head=lambda name: lark_literal(f'{name}">'),
        tail='"</function>"',
        open=lambda name, raw: f'"<param name=\\"" {name} "\\">"',
        close="</param>",
        after_close="",
        raw=_minimax_raw,
        tokenizer=tokenizer,
    )
    return params_call(tools, markup)


DSML = "｜DSML｜"


def deepseek_v32_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<｜DSML｜invoke name="NAME">\\n<｜DSML｜parameter name="K" string="true|false">V
    </｜DSML｜parameter>\\n…</｜DSML｜invoke>\\n`, several in one `<｜DSML｜function_calls>`
    section (DeepSeek V3.2). `string="true"` values are raw text, the others JSON."""
    markup = ParamMarkup(
        head=lambda name: lark_literal(f'<{DSML}invoke name="{name}">\n'),
        tail=lark_literal(f"</{DSML}invoke>\n"),
        open=lambda name, raw: (
            lark_literal(f'<{DSML}parameter name="')
            + f" {name} "
            + lark_literal(f'" string="{str(raw).lower()}">')
        ),
        close=f"</{DSML}parameter>",
        after_close='"\\n"',
        raw=lambda sent, resolved: string_only(resolved),
        tokenizer=tokenizer,
    )
    return params_call(tools, markup)


def muse_spark_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`<atem:invoke name="NAME"><atem:parameter name="K">V</atem:parameter>…</atem:invoke>`,
    several in one `<atem:function_calls>` section (Muse Spark). Its parser JSON-decodes every
    value first, so every value is written as JSON; newlines between elements are optional."""
    markup = ParamMarkup(
        head=lambda name: lark_literal(f'<atem:invoke name="{name}">') + ' "\\n"?',
        tail='"</atem:invoke>" "\\n"?',
        open=lambda name, raw: f'"<atem:parameter name=\\"" {name} "\\">"',
        close="</atem:parameter>",
        after_close='"\\n"?',
        raw=lambda sent, resolved: False,
        tokenizer=tokenizer,
    )
    return params_call(tools, markup)


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
        text = rules.terminal(_bounded_text(schema, close))
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
    return [v if isinstance(v, str) else _json_text(v) for v in values]


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _bounded_text(schema: dict[str, Any], close: str) -> str:
    """Text without `close`, within the schema's min/maxLength (bounds past
    `MAX_COUNTED_LENGTH` are dropped)."""
    low, high = _int_or(schema.get("minLength"), 0), _int_or(schema.get("maxLength"), None)
    low = low if low <= MAX_COUNTED_LENGTH else 0
    high = high if high is not None and high <= MAX_COUNTED_LENGTH else None
    if not low and high is None:
        return text_without(close)
    return f"/(?s:.{{{low},{'' if high is None else high}}})/ & {text_without(close)}"


# --- Gemma 4 -----------------------------------------------------------------------------------


def gemma4_call(tokenizer: TokenizerWrapper, tools: Sequence[CallTool]) -> str:
    """`call:NAME{key:value,…}<tool_call|>` after `<|tool_call>` (Gemma 4): bare keys in sorted
    order, as its template writes them, strings in `<|"|>` quotes, numbers, booleans and null
    bare, nested objects and arrays in the same notation."""
    rules = LarkRules()
    notation = GemmaNotation(rules, markup_symbol(tokenizer, GEMMA_QUOTE))
    end = markup_symbol(tokenizer, "<tool_call|>")
    alternatives = [f"{lark_literal(f'call:{t.name}')} {notation.value(t.schema)}" for t in tools]
    rules.define("call", f"({' | '.join(alternatives)}) {end}")
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
            text = self._rules.terminal(_bounded_text(schema, GEMMA_QUOTE))
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
        return lark_literal(_json_text(value))

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
                _skip_or_refuse(name, required, "gemma4")
                continue
            items.append(
                (f"{lark_literal(name + ':')} {self.value(props[name])}", name in required)
            )
        return f'"{{" {_joined(self._rules, items, lark_literal(","))} "}}"'

    def _array(self, schema: dict[str, Any]) -> str:
        item = self._rules.rule(self.value(schema.get("items")))
        low, high = _int_or(schema.get("minItems"), 0), _int_or(schema.get("maxItems"), None)
        if high is not None and high <= 0:
            return '"[" "]"'
        rest = f"{{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        body = f'{item} ("," {item}){rest}'
        return f'"[" {body if low > 0 else f"({body})?"} "]"'


def _int_or(value: Any, default: int | None) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


_CONTAINER_KEYS = frozenset({"properties", "required", "items", "additionalProperties"})


# --- shared pieces -----------------------------------------------------------------------------


def _skip_or_refuse(name: str, required: list[str], family: str) -> None:
    """A property name the family's notation cannot write: left out when optional."""
    if name in required:
        raise InvalidRequest(f"the {family} tool-call format cannot write the parameter {name!r}")


def text_without(marker: str) -> str:
    """A lark terminal body: any text in which `marker` does not occur. (`grammar.text_without`
    escapes non-ASCII characters such as DeepSeek's `｜` into invalid regex escapes.)"""
    return f"/(?s:.*)/ & ~/(?s:.*){''.join(map(_regex_char, marker))}(?s:.*)/"


def _regex_char(char: str) -> str:
    if not char.isascii() or char.isalnum() or char in " _-<>=,:;'\"":
        return char
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, "\\" + char)


def _joined(rules: LarkRules, items: list[tuple[str, bool]], separator: str) -> str:
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
