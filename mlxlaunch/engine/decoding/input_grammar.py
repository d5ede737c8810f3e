"""A freeform tool's input grammar, written again as one part of a tool-call grammar.

`input_rules` reads the client's Lark rules (or its one regular expression) and writes them as
rules of the call grammar the family's markup is built into (`call_grammars`): every name
prefixed, so none clashes with the call's own rules, and, for a family whose arguments are
JSON, every character as a JSON string writes it (`"` → `\\"`, newline → `\\n`, ...: the
JSON-string escape, a homomorphism, applied to literals and to each character set of each
regex, read with the standard library's regex parser), since llguidance cannot nest a Lark
grammar inside a JSON string. Families that write a string parameter as raw text take the
grammar's characters as they are.

Every terminal becomes a rule whose lexemes are literal runs and single characters. The
lexer is greedy and never backs off (measured with llguidance 1.9): an escaped line `(.*)`
then `\\n` as lexemes takes the `\\` of `\\n` as the start of an escaped backslash and then
fails on `n`. A one-character lexeme ends after its character, so the parser, not the lexer,
decides where a terminal ends; a patch of a few kilobytes costs a parser step per character.

Supported: rules and terminals (`?rule`, `!rule`, priorities and `-> alias` are read and
dropped), strings (`"..."i` too), ranges, regexes without look-around, backreferences or
case-insensitive parts, `[...]`, `~ n..m`, and `%import common.NAME` for the common terminals
below; `%ignore` and llguidance's extensions are refused, naming the grammar's field.
"""

from __future__ import annotations

import ast
import functools
import re
import re._constants as sre  # the standard library's regex parser: its tree, not its matcher
import re._parser as sre_parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import llguidance

from mlxlaunch.engine.decoding.grammar import PARSER_LIMITS, lark_literal
from mlxlaunch.engine.decoding.schema_limits import check_grammar_text
from mlxlaunch.engine.types import InputGrammar, InvalidRequest

# How a JSON string writes the characters it must escape (json.dumps's choices).
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHORT_ESCAPES |= {"\b": "\\b", "\f": "\\f"}
_SPECIALS = ['"', "\\", *(chr(c) for c in range(0x20))]
_UNESCAPED = r"[^\u0022\u005c\u0000-\u001f]"  # what a JSON string holds as it is
# Characters tried to tell whether a class holds any character a JSON string keeps as is.
_PROBES = [chr(c) for c in range(0x20, 0x7F)] + ["\u00a0", "é", "\u4e00", "\U0001f600"]

# Distinct character classes one grammar may use: each is a lexeme of its own, which the JSON
# escape writes as about 40 alternatives (a 1 MiB grammar of `/[a]/ | /[b]/ | …` would be
# 100 MB of rules otherwise).
MAX_CHARACTER_CLASSES = 1_000

# `%import common.NAME`: Lark's common terminals a tool grammar is likely to use.
COMMON_TERMINALS = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(\r?\n)+",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LETTER": r"[A-Za-z]",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[A-Za-z_][A-Za-z0-9_]*",
    "ESCAPED_STRING": r'"(\\.|[^"\\\n])*"',
}

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\f\r]+|\\\r?\n)
  | (?P<newline>\n)
  | (?P<comment>//[^\n]*|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9]+)
  | (?P<op>->|\.\.|[:|()\[\]?*+~.,{}!])
    """,
    re.VERBOSE,
)


class GrammarError(ValueError):
    """The client's grammar cannot be read or served (the reason, without the field)."""


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int


@dataclass(frozen=True)
class InputRules:
    """A tool's input grammar as rules of a call grammar: `start` names its top rule."""

    start: str
    text: str


def input_rules(grammar: InputGrammar, prefix: str, *, escaped: bool) -> InputRules:
    """`grammar` as Lark rules whose names start with `prefix` (lowercase letters and
    digits), its characters JSON-string-escaped when `escaped`.

    Raises:
        InvalidRequest: the grammar cannot be read, uses what is not supported, or is too
            large; the message names `grammar.field`.
    """
    try:
        return _rewritten(grammar.syntax, grammar.definition, prefix, escaped)
    except ValueError as exc:  # GrammarError, or a bound of schema_limits
        raise InvalidRequest(f"{grammar.field}: {exc}") from exc


def check_input_grammar(grammar: InputGrammar) -> None:
    """Refuse a grammar too large, unreadable or that llguidance cannot compile.

    Raises:
        InvalidRequest: naming `grammar.field`.
    """
    problem = _problem(grammar.syntax, grammar.definition)
    if problem:
        raise InvalidRequest(f"{grammar.field}: {problem}")


@functools.lru_cache(maxsize=16)
def _problem(syntax: str, definition: str) -> str:
    """What is wrong with a grammar ("" for nothing), remembered: Codex sends the same one
    with every request."""
    try:
        rules = _rewritten(syntax, definition, "c", False)
    except ValueError as exc:  # GrammarError, or a bound of schema_limits
        return str(exc)
    compiled = llguidance.grammar_from("lark", f"start: {rules.start}\n{rules.text}")
    error = llguidance.LLMatcher.validate_grammar(compiled, limits=PARSER_LIMITS)
    return f"the grammar does not compile: {error.strip()}" if error else ""


@functools.lru_cache(maxsize=16)
def _rewritten(syntax: str, definition: str, prefix: str, escaped: bool) -> InputRules:
    patterns = _Writer(prefix, escaped)
    if syntax == "regex":
        check_grammar_text(definition, [definition])
        start = f"{prefix}_start"
        patterns.lines.append(f"{start}: {patterns.regex(definition, 0)}")
    else:
        check_grammar_text(definition, [])  # the size, before a token is read
        tokens = list(_tokens(definition))
        check_grammar_text(definition, [t.text for t in tokens if t.kind == "regex"])
        start = _LarkReader(patterns).read(tokens)
    return InputRules(start, patterns.text())


def _tokens(text: str) -> Iterator[_Token]:
    at, line = 0, 1
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None:
            shown = text[at : at + 20]
            raise GrammarError(f"cannot read the grammar at line {line}: {shown!r}")
        kind = found.lastgroup or ""
        if kind not in ("space", "comment"):
            yield _Token(kind, found.group(), line)
        line += found.group().count("\n")
        at = found.end()


# --- characters and regexes ---------------------------------------------------------------


def _class_char(char: str) -> str:
    """A character inside a regex class, in the syntax Python's and llguidance's regexes
    share."""
    if char.isascii() and char.isalnum():
        return char
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_CATEGORIES = {
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\w",
    sre.CATEGORY_NOT_WORD: r"\W",
}


@dataclass
class _Writer:
    """Rules being written for one grammar: literal runs inline, each character class one
    terminal (shared by every place that uses the same class)."""

    prefix: str
    escaped: bool
    lines: list[str] = field(default_factory=list)
    classes: dict[str, str] = field(default_factory=dict)  # class source → terminal name

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def literal(self, text: str) -> str:
        if not text:
            return '""'
        if self.escaped:
            text = "".join(_SHORT_ESCAPES.get(c, c) if c in _SPECIALS else c for c in text)
            text = re.sub(r"[\x00-\x1f]", lambda m: f"\\u{ord(m.group()):04x}", text)
        return lark_literal(text)

    def char_class(self, source: str) -> str:
        """A terminal for one character of the class `source` (a regex class)."""
        name = self.classes.get(source)
        if name is not None:
            return name
        if len(self.classes) >= MAX_CHARACTER_CLASSES:
            raise GrammarError(
                f"more than {MAX_CHARACTER_CLASSES} distinct character classes, too many to "
                "constrain output"
            )
        name = f"{self.prefix.upper()}C{len(self.classes)}"
        self.classes[source] = name
        if not self.escaped:
            body = f"/{source}/"
        else:
            members = re.compile(source)
            parts = [lark_literal(_escape(c)) for c in _SPECIALS if members.fullmatch(c)]
            probes = _PROBES + [c for c in _class_members(source) if c not in _SPECIALS]
            if any(members.fullmatch(c) for c in probes):
                parts.insert(0, f"(/{source}/ & /{_UNESCAPED}/)")
            if not parts:
                raise GrammarError(f"the character class {source!r} matches nothing")
            body = " | ".join(parts)
        self.lines.append(f"{name}: {body}")
        return name

    def regex(self, pattern: str, flags: int) -> str:
        """Lark for the language of `pattern`, its characters as this writer writes them."""
        try:
            parsed = sre_parse.parse(pattern, flags)
        except (re.error, OverflowError, RecursionError) as exc:
            raise GrammarError(f"regex /{pattern[:60]}/: {exc}") from exc
        if parsed.state.flags & re.IGNORECASE:
            raise GrammarError(
                f"regex /{pattern[:60]}/: case-insensitive matching is not supported"
            )
        return f"({self._sequence(list(parsed), bool(parsed.state.flags & re.DOTALL))})"

    def _sequence(self, items: list[tuple[Any, Any]], dotall: bool) -> str:
        while items and items[0] in _STARTS:
            items = items[1:]  # a grammar matches whole: edge anchors say nothing
        while items and items[-1] in _ENDS:
            items = items[:-1]
        parts: list[str] = []
        run: list[str] = []
        for op, value in items:
            if op is sre.LITERAL:
                run.append(chr(value))
                continue
            if run:
                parts.append(self.literal("".join(run)))
                run = []
            parts.append(self._item(op, value, dotall))
        if run:
            parts.append(self.literal("".join(run)))
        return " ".join(parts) or '""'

    def _item(self, op: Any, value: Any, dotall: bool) -> str:
        if op is sre.ANY:
            return self.char_class(r"[\s\S]" if dotall else r"[^\n]")
        if op is sre.NOT_LITERAL:
            return self.char_class(f"[^{_class_char(chr(value))}]")
        if op is sre.IN:
            return self.char_class(_class_source(value))
        if op is sre.BRANCH:
            return "(" + " | ".join(self._sequence(list(b), dotall) for b in value[1]) + ")"
        if op is sre.SUBPATTERN:
            _, add, remove, inner = value
            if add & re.IGNORECASE:
                raise GrammarError("case-insensitive regex groups are not supported")
            inside = (dotall or bool(add & re.DOTALL)) and not remove & re.DOTALL
            return f"({self._sequence(list(inner), inside)})"
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, inner = value
            return f"({self._sequence(list(inner), dotall)}){_repeat(low, high)}"
        names = {
            sre.AT: "anchors inside a pattern",
            sre.GROUPREF: "backreferences",
            sre.GROUPREF_EXISTS: "conditional groups",
            sre.ASSERT: "look-ahead and look-behind",
            sre.ASSERT_NOT: "look-ahead and look-behind",
        }
        raise GrammarError(f"regexes with {names.get(op, str(op).lower())} are not supported")


_STARTS = [(sre.AT, sre.AT_BEGINNING), (sre.AT, sre.AT_BEGINNING_STRING)]
_ENDS = [(sre.AT, sre.AT_END), (sre.AT, sre.AT_END_STRING)]


def _escape(char: str) -> str:
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _repeat(low: int, high: int) -> str:
    if high is sre.MAXREPEAT or high == sre.MAXREPEAT:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low},{high}}}"


def _class_source(items: list[tuple[Any, Any]]) -> str:
    parts: list[str] = []
    for op, value in items:
        if op is sre.NEGATE:
            parts.insert(0, "^")
        elif op is sre.LITERAL:
            parts.append(_class_char(chr(value)))
        elif op is sre.RANGE:
            parts.append(f"{_class_char(chr(value[0]))}-{_class_char(chr(value[1]))}")
        elif op is sre.CATEGORY and value in _CATEGORIES:
            parts.append(_CATEGORIES[value])
        else:
            raise GrammarError(f"regex classes with {str(value).lower()} are not supported")
    return f"[{''.join(parts)}]"


def _class_members(source: str) -> list[str]:
    """The characters a class names outright (its literals and range ends)."""
    found = re.findall(r"\\u([0-9a-f]{4})|\\U([0-9a-f]{8})|([A-Za-z0-9])", source)
    return [chr(int(a or b, 16)) if (a or b) else c for a, b, c in found]


# --- Lark -----------------------------------------------------------------------------------


_REGEX_FLAGS = {"s": re.DOTALL, "m": re.MULTILINE, "x": re.VERBOSE, "u": 0, "l": 0}
_PASSED = ("|", "(", ")", "?", "*", "+", "~")


class _LarkReader:
    """Reads Lark definitions statement by statement and writes them renamed."""

    def __init__(self, writer: _Writer) -> None:
        self.writer = writer
        self.names: dict[str, str] = {}  # the client's name → ours
        self.defined: set[str] = set()
        self.used: dict[str, int] = {}  # name → line of its first use

    def read(self, tokens: list[_Token]) -> str:
        for statement in _statements(tokens):
            self._statement(statement)
        missing = sorted(set(self.used) - self.defined, key=self.used.__getitem__)
        if missing:
            name = missing[0]
            raise GrammarError(f"line {self.used[name]}: {name!r} is used but never defined")
        if "start" not in self.defined:
            raise GrammarError("the grammar has no `start` rule")
        return self._name("start")

    def _name(self, name: str) -> str:
        ours = self.names.get(name)
        if ours is None:
            prefix = self.writer.prefix
            terminal = name.lstrip("_")[:1].isupper()
            ours = f"{prefix}t{len(self.names)}_{name.lower()}" if terminal else f"{prefix}_{name}"
            self.names[name] = ours
        return ours

    def _define(self, name: str, line: int) -> str:
        if name in self.defined:
            raise GrammarError(f"line {line}: {name!r} is defined twice")
        self.defined.add(name)
        return self._name(name)

    def _statement(self, tokens: list[_Token]) -> None:
        head = tokens[0]
        if head.kind == "directive":
            self._directive(tokens)
            return
        at = 1 if head.text in ("?", "!") else 0
        if at >= len(tokens) or tokens[at].kind != "name":
            raise GrammarError(f"line {head.line}: expected a rule or terminal name")
        name = tokens[at]
        at += 1
        if at + 1 < len(tokens) and tokens[at].text == "." and tokens[at + 1].kind == "number":
            at += 2  # a priority: the grammar's language is the same without it
        if at >= len(tokens) or tokens[at].text != ":":
            raise GrammarError(f"line {name.line}: expected ':' after {name.text!r}")
        body = self._body(tokens[at + 1 :])
        self.writer.lines.append(f"{self._define(name.text, name.line)}: {body}")

    def _directive(self, tokens: list[_Token]) -> None:
        head = tokens[0]
        words = [t.text for t in tokens[1:]]
        if head.text != "%import" or not words:
            raise GrammarError(f"line {head.line}: {head.text} is not supported")
        if words[:3] == ["common", ".", words[2] if len(words) > 2 else ""] and len(words) == 3:
            imported = [words[2]]
        elif words[:2] == ["common", "("] and words[-1:] == [")"]:
            imported = [w for w in words[2:-1] if w != ","]
        else:
            raise GrammarError(f"line {head.line}: only `%import common.NAME` is supported")
        for name in imported:
            if name not in COMMON_TERMINALS:
                known = ", ".join(COMMON_TERMINALS)
                raise GrammarError(f"line {head.line}: common.{name} is not one of {known}")
            body = self.writer.regex(COMMON_TERMINALS[name], 0)
            self.writer.lines.append(f"{self._define(name, head.line)}: {body}")

    def _body(self, tokens: list[_Token]) -> str:
        out: list[str] = []
        at = 0
        while at < len(tokens):
            token = tokens[at]
            at += 1
            if token.kind == "name":
                self.used.setdefault(token.text, token.line)
                out.append(self._name(token.text))
            elif token.kind == "string":
                if (
                    at + 1 < len(tokens)
                    and tokens[at].text == ".."
                    and tokens[at + 1].kind == "string"
                ):
                    out.append(self._range(token, tokens[at + 1]))
                    at += 2
                else:
                    out.append(self._string(token))
            elif token.kind == "regex":
                out.append(self._regex(token))
            elif token.text == "->":
                if at < len(tokens) and tokens[at].kind == "name":
                    at += 1  # an alias names a tree node: the language is the same
            elif token.text == "[":
                out.append("(")
            elif token.text == "]":
                out.append(")?")
            elif token.text == "~":
                at = self._counted(tokens, at, out, token.line)
            elif token.text in _PASSED:
                out.append(token.text)
            else:
                raise GrammarError(f"line {token.line}: unexpected {token.text!r}")
        return " ".join(out) or '""'

    def _counted(self, tokens: list[_Token], at: int, out: list[str], line: int) -> int:
        """`item ~ n` or `item ~ n..m`, as `{n}` / `{n,m}` (bounded as regex counts are)."""
        numbers: list[int] = []
        while at < len(tokens) and (tokens[at].kind == "number" or tokens[at].text == ".."):
            if tokens[at].kind == "number":
                numbers.append(int(tokens[at].text[:6]))
            at += 1
        if not 1 <= len(numbers) <= 2 or not out:
            raise GrammarError(f"line {line}: expected `~ n` or `~ n..m`")
        check_grammar_text("", [f"x{{{numbers[-1]}}}"])
        out[-1] += "{" + ",".join(str(n) for n in numbers) + "}"
        return at

    def _string(self, token: _Token) -> str:
        text, insensitive = _string_value(token)
        if not insensitive:
            return self.writer.literal(text)
        parts = []
        for char in text:
            if char.lower() == char.upper():
                parts.append(self.writer.literal(char))
            else:
                both = "".join(sorted({char.lower(), char.upper()}))
                parts.append(self.writer.char_class(f"[{''.join(map(_class_char, both))}]"))
        return "(" + " ".join(parts) + ")" if parts else '""'

    def _range(self, low: _Token, high: _Token) -> str:
        (first, _), (last, _) = _string_value(low), _string_value(high)
        if len(first) != 1 or len(last) != 1 or first > last:
            raise GrammarError(f"line {low.line}: a range needs two characters in order")
        return self.writer.char_class(f"[{_class_char(first)}-{_class_char(last)}]")

    def _regex(self, token: _Token) -> str:
        body, _, flag_text = token.text[1:].rpartition("/")
        flags = 0
        for flag in flag_text:
            if flag == "i":
                raise GrammarError(f"line {token.line}: case-insensitive regexes are not supported")
            flags |= _REGEX_FLAGS[flag]
        return self.writer.regex(body.replace("\\/", "/"), flags)


def _string_value(token: _Token) -> tuple[str, bool]:
    insensitive = token.text.endswith("i")
    quoted = token.text[:-1] if insensitive else token.text
    if "\\" not in quoted:
        return quoted[1:-1], insensitive
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError) as exc:
        raise GrammarError(f"line {token.line}: cannot read the string {quoted[:40]}") from exc
    return str(value), insensitive


def _statements(tokens: list[_Token]) -> Iterator[list[_Token]]:
    """Tokens by statement: a statement goes on over a line that opens with `|` or while
    a bracket is open."""
    current: list[_Token] = []
    depth = 0
    at_line_start = True
    for token in tokens:
        if token.kind == "newline":
            at_line_start = True
            continue
        if at_line_start and current and depth == 0 and token.text != "|":
            yield current
            current = []
        at_line_start = False
        depth += token.text in "([" and token.kind == "op"
        depth -= token.text in ")]" and token.kind == "op"
        current.append(token)
    if current:
        yield current
