"""Streaming readers of parameter-style tool calls (Qwen3-Coder, GLM, LongCat, MiniMax, DSML).

Each family's call text is fed whole, in every split and one character at a time: the pieces
must not depend on the split, each parameter must be sent by the feed that closes it, the
arguments must come out typed by the tool's schema as mlx-lm's parser for the family types
them, and a long value fed in small pieces must cost time linear in its length.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from parser_helpers import splits

from mlxlaunch.engine.output.param_readers import param_span_reader
from mlxlaunch.engine.output.spans import CallArgs, CallBegin, CallEnd, CallPiece
from mlxlaunch.engine.output.tools import parser_tools
from mlxlaunch.engine.types import ToolSpec
from mlxlaunch.store.dialects import DIALECTS

FIXTURES = Path(__file__).parent / "fixtures" / "chat-templates"
DIALECT_NAMES = ["qwen3_coder", "glm47", "longcat", "minimax_m2", "deepseek_v32"]

BASH = ToolSpec(
    name="Bash",
    description="Run a command",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
)
EDIT = ToolSpec(
    name="Edit",
    description="Edit a file",
    parameters={
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "line": {"type": "integer"},
            "replace_all": {"type": "boolean"},
            "options": {"type": "object"},
            "paths": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": "number"},
            "note": {"type": "string"},
            "code": {"type": "string"},
        },
    },
)
TOOLS = [BASH, EDIT]
# Strings that look like numbers or markup must stay strings, markup must not leak.
TYPED_ARGS: dict[str, Any] = {
    "file_path": "src/app.py",
    "line": 42,
    "replace_all": True,
    "options": {"mode": "fast", "depth": 2},
    "paths": ["a.py", "b/c.py"],
    "ratio": 0.5,
    "note": "123",
    "code": 'if a < b > c: print("</para", "</arg_val", "</｜DSML｜param", "é")',
}
BASH_ARGS = {"command": "ls -la src", "description": "List the source files"}

Call = tuple[str, dict[str, Any]]


# --- writing calls as each family does (after its chat template) -----------------------------


def _text(value: Any, python: bool = False) -> str:
    if isinstance(value, str):
        return value
    if python and not isinstance(value, dict | list):
        return str(value)  # Qwen3-Coder's template: `value | string` (True -> "True")
    return json.dumps(value, ensure_ascii=False)


def write_qwen3_coder(calls: Sequence[Call]) -> str:
    out = "\n"
    for name, args in calls:
        out += f"<function={name}>\n"
        for key, value in args.items():
            out += f"<parameter={key}>\n{_text(value, python=True)}\n</parameter>\n"
        out += "</function>\n"
    return out


def write_glm(calls: Sequence[Call], prefix: str = "") -> str:
    ((name, args),) = calls
    out = f"{name}\n"
    for key, value in args.items():
        out += f"<{prefix}arg_key>{key}</{prefix}arg_key>\n"
        out += f"<{prefix}arg_value>{_text(value)}</{prefix}arg_value>\n"
    return out


def write_minimax(calls: Sequence[Call]) -> str:
    out = "\n"
    for name, args in calls:
        out += f'<invoke name="{name}">\n'
        for key, value in args.items():
            out += f'<parameter name="{key}">{_text(value)}</parameter>\n'
        out += "</invoke>\n"
    return out


def write_dsml(calls: Sequence[Call]) -> str:
    out = "\n"
    for name, args in calls:
        out += f'<｜DSML｜invoke name="{name}">\n'
        for key, value in args.items():
            string = "true" if isinstance(value, str) else "false"
            out += f'<｜DSML｜parameter name="{key}" string="{string}">'
            out += f"{_text(value)}</｜DSML｜parameter>\n"
        out += "</｜DSML｜invoke>\n"
    return out


WRITERS: dict[str, Callable[[Sequence[Call]], str]] = {
    "qwen3_coder": write_qwen3_coder,
    "glm47": write_glm,
    "longcat": lambda calls: write_glm(calls, "longcat_"),
    "minimax_m2": write_minimax,
    "deepseek_v32": write_dsml,
}
# The text that completes a call's name, and a parameter's closing tag.
NAME_ENDS = {
    "qwen3_coder": "<function=Bash>",
    "glm47": "Bash\n",
    "longcat": "Bash\n",
    "minimax_m2": '<invoke name="Bash">',
    "deepseek_v32": '<｜DSML｜invoke name="Bash">',
}
VALUE_CLOSE = {
    "qwen3_coder": "</parameter>",
    "glm47": "</arg_value>",
    "longcat": "</longcat_arg_value>",
    "minimax_m2": "</parameter>",
    "deepseek_v32": "</｜DSML｜parameter>",
}
MULTI_CALL = ["qwen3_coder", "minimax_m2", "deepseek_v32"]  # several calls in one span
# mlx-lm's parsers, imported while collecting: the import sets an environment variable (which
# the conftest would otherwise report as a test's leak).
MLX_LM_PARSERS = {
    name: importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    for name in ("qwen3_coder", "glm47", "longcat", "minimax_m2")
}


# --- reading -----------------------------------------------------------------------------------


def read(
    dialect: str,
    pieces: Iterable[str],
    complete: bool = True,
    tools: Sequence[ToolSpec] = TOOLS,
) -> list[CallPiece] | None:
    """Every piece a reader returns for the span fed as `pieces`; None when it gives up."""
    factory = param_span_reader(dialect, tools)
    assert factory is not None
    reader = factory()
    out: list[CallPiece] = []
    for piece in pieces:
        out += reader.feed(piece)
    assert reader.committed == bool(out)
    closing = reader.close(complete)
    if closing is None:
        assert not out, "a committed reader must end its call"
        return None
    return out + closing


def calls_of(pieces: list[CallPiece] | None) -> list[Call]:
    """The calls in `pieces`, checking their shape: CallBegin, CallArgs…, CallEnd whose
    arguments are the CallArgs joined (an incomplete call: they are its prefix, the parser
    sends the rest) and a JSON object."""
    assert pieces is not None
    calls: list[Call] = []
    name: str | None = None
    args: list[str] = []
    for piece in pieces:
        if isinstance(piece, CallBegin):
            assert name is None, "a call began inside another"
            name, args = piece.name, []
        elif isinstance(piece, CallArgs):
            assert name is not None
            args.append(piece.text)
        else:
            assert isinstance(piece, CallEnd) and name is not None
            if piece.complete:
                assert args, "every complete call sends its arguments as CallArgs"
                assert piece.arguments == "".join(args)
            else:
                assert piece.arguments.startswith("".join(args))
            parsed = json.loads(piece.arguments)
            assert isinstance(parsed, dict)
            calls.append((name, parsed))
            name = None
    assert name is None, "a call was left open"
    return calls


def fixture_call(family: str, dialect: str) -> tuple[str, Call]:
    """The span body of the family's real template's example call, and that call."""
    facts = json.loads((FIXTURES / f"{family}.tokens.json").read_text())
    rendered = facts["tool_call"]["assistant_turn_as_rendered"]
    start_marker, end_marker = DIALECTS[dialect].tool_call_start, DIALECTS[dialect].tool_call_end
    assert start_marker and end_marker
    start = rendered.index(start_marker) + len(start_marker)
    example = facts["tool_call"]["example"]
    return rendered[start : rendered.index(end_marker, start)], (
        example["name"],
        example["arguments"],
    )


def assert_typed(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


# --- the real templates' calls -------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "dialect"),
    [("qwen3-coder", "qwen3_coder"), ("glm-4.6", "glm47"), ("minimax-m2", "minimax_m2")],
)
def test_fixture_call_reads_the_same_in_every_split(family: str, dialect: str) -> None:
    body, call = fixture_call(family, dialect)
    whole = read(dialect, [body])
    assert calls_of(whole) == [call]
    for pieces in splits(body):
        assert read(dialect, pieces) == whole


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_arguments_are_typed_by_the_schema(dialect: str) -> None:
    body = WRITERS[dialect]([("Edit", TYPED_ARGS)])
    for pieces in ([body], list(body)):
        ((name, args),) = calls_of(read(dialect, pieces))
        assert name == "Edit"
        assert_typed(args, TYPED_ARGS)


@pytest.mark.parametrize("dialect", sorted(MLX_LM_PARSERS))
def test_values_read_as_mlx_lm_reads_them(dialect: str) -> None:
    """mlx-lm's own parser for the family reads the same text to the same arguments."""
    body = WRITERS[dialect]([("Edit", TYPED_ARGS)])
    theirs = MLX_LM_PARSERS[dialect].parse_tool_call(body, parser_tools(TOOLS))
    ((_, ours),) = calls_of(read(dialect, [body]))
    assert_typed(ours, theirs["arguments"])


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_each_parameter_is_sent_by_the_feed_that_closes_it(dialect: str) -> None:
    body = WRITERS[dialect]([("Bash", BASH_ARGS)])
    factory = param_span_reader(dialect, TOOLS)
    assert factory is not None
    reader = factory()
    sent_at: dict[str, int] = {}
    for at, char in enumerate(body):
        for piece in reader.feed(char):
            key = piece.text if isinstance(piece, CallArgs) else type(piece).__name__
            sent_at.setdefault(key, at)
    assert sent_at["CallBegin"] == body.index(NAME_ENDS[dialect]) + len(NAME_ENDS[dialect]) - 1
    close = VALUE_CLOSE[dialect]
    assert sent_at['{"command": "ls -la src"'] == body.index(close) + len(close) - 1
    second = body.index(close, body.index(close) + 1) + len(close) - 1
    assert sent_at[', "description": "List the source files"'] == second
    assert reader.committed


@pytest.mark.parametrize("dialect", MULTI_CALL)
def test_a_call_ends_at_its_end_tag(dialect: str) -> None:
    body = WRITERS[dialect]([("Bash", BASH_ARGS)])
    factory = param_span_reader(dialect, TOOLS)
    assert factory is not None
    reader = factory()
    pieces = reader.feed(body)
    assert isinstance(pieces[-1], CallEnd)
    assert reader.close(True) == []
    assert calls_of(pieces) == [("Bash", BASH_ARGS)]


@pytest.mark.parametrize("dialect", MULTI_CALL)
def test_several_calls_in_one_span(dialect: str) -> None:
    calls = [("Bash", BASH_ARGS), ("Edit", TYPED_ARGS), ("Bash", {"command": "pwd"})]
    body = WRITERS[dialect](calls)
    assert calls_of(read(dialect, [body])) == calls
    assert calls_of(read(dialect, list(body))) == calls


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_a_cut_call_keeps_the_parameters_finished(dialect: str) -> None:
    body = WRITERS[dialect]([("Bash", BASH_ARGS)])
    in_second_value = body.index("source files")
    assert calls_of(read(dialect, [body[:in_second_value]], complete=False)) == [
        ("Bash", {"command": "ls -la src"})
    ]
    in_first_value = body.index("-la")
    assert calls_of(read(dialect, [body[:in_first_value]], complete=False)) == [("Bash", {})]
    in_name = body.index(NAME_ENDS[dialect]) + 2
    assert read(dialect, [body[:in_name]], complete=False) is None


@pytest.mark.parametrize("dialect", MULTI_CALL)
def test_a_cut_second_call_leaves_the_first(dialect: str) -> None:
    body = WRITERS[dialect]([("Bash", {"command": "pwd"}), ("Bash", BASH_ARGS)])
    cut = body.rindex("Bash") + 2  # inside the second call's name
    assert calls_of(read(dialect, [body[:cut]], complete=False)) == [("Bash", {"command": "pwd"})]


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@pytest.mark.parametrize(
    "garbage",
    ["", "I should look at the files first.", "<function Bash> run ls", "Bash please\n<b>x</b>"],
)
def test_unreadable_span_gives_up(dialect: str, garbage: str) -> None:
    assert read(dialect, [garbage]) is None
    assert read(dialect, list(garbage)) is None


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_a_repeated_parameter_keeps_its_first_value(dialect: str) -> None:
    body = WRITERS[dialect]([("Bash", {"command": "ls", "description": "one"})])
    again = WRITERS[dialect]([("Bash", {"command": "rm -rf /", "description": "two"})])
    # the second call's parameters, spliced into the first call
    first_param_end = body.index(VALUE_CLOSE[dialect]) + len(VALUE_CLOSE[dialect])
    start = again.index(NAME_ENDS[dialect]) + len(NAME_ENDS[dialect])
    end = again.rindex(VALUE_CLOSE[dialect]) + len(VALUE_CLOSE[dialect])
    spliced = body[:first_param_end] + again[start:end] + body[first_param_end:]
    assert calls_of(read(dialect, [spliced])) == [("Bash", {"command": "ls", "description": "two"})]


def test_a_call_without_parameters() -> None:
    for dialect in DIALECT_NAMES:
        assert calls_of(read(dialect, [WRITERS[dialect]([("Bash", {})])])) == [("Bash", {})]
    assert calls_of(read("glm47", ["Bash"])) == [("Bash", {})]  # `<tool_call>Bash</tool_call>`


def test_glm_name_and_first_key_on_one_line() -> None:
    body = "\nBash<arg_key>command</arg_key><arg_value>ls</arg_value>"
    assert calls_of(read("glm47", list(body))) == [("Bash", {"command": "ls"})]


def test_glm_body_written_as_json() -> None:
    body = '{"name": "Edit", "arguments": {"line": "7", "note": "8"}}'
    assert calls_of(read("glm47", list(body))) == [("Edit", {"line": 7, "note": "8"})]
    assert calls_of(read("glm47", ['Bash\n{"command": "ls"}\n'])) == [("Bash", {"command": "ls"})]
    assert read("glm47", [body[:-3]]) is None


# --- value conversion the families differ on ----------------------------------------------------

ODD = ToolSpec(
    name="Odd",
    description="Odd schemas",
    parameters={
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "custom": {"type": "weird"},
            "config": {"type": "object"},
            "flag": {"type": "boolean"},
        },
    },
)


@pytest.mark.parametrize(
    ("dialect", "args", "expected"),
    [
        # mlx-lm refuses "1.5" for an integer and fails the call: the text is kept instead.
        ("qwen3_coder", {"count": "1.5"}, {"count": "1.5"}),
        ("qwen3_coder", {"count": "null"}, {"count": None}),
        ("qwen3_coder", {"flag": "True", "config": "{'a': 1}"}, {"flag": True, "config": {"a": 1}}),
        ("qwen3_coder", {"custom": "42", "undeclared": "42"}, {"custom": "42", "undeclared": "42"}),
        ("qwen3_coder", {"config": "not json"}, {"config": "not json"}),
        ("glm47", {"undeclared": "42", "custom": "42"}, {"undeclared": 42, "custom": "42"}),
        ("glm47", {"config": "{bad"}, {"config": "{bad"}),
        ("glm47", {"count": "{1, 2}"}, {"count": "{1, 2}"}),  # a Python set: not JSON
        ("minimax_m2", {"maybe": "7"}, {"maybe": 7}),
        ("minimax_m2", {"maybe": "null", "flag": "yes"}, {"maybe": None, "flag": True}),
        ("minimax_m2", {"custom": "42", "undeclared": "42"}, {"custom": "42", "undeclared": "42"}),
        ("deepseek_v32", {"count": "3", "custom": "[1]"}, {"count": "3", "custom": "[1]"}),
        ("qwen3_coder", {"count": "NaN"}, {"count": "NaN"}),
        # Values no reader holds stay the text the model wrote (issue 35, item 7).
        ("qwen3_coder", {"count": "7" * 5000}, {"count": "7" * 5000}),
        ("glm47", {"undeclared": "7" * 5000}, {"undeclared": "7" * 5000}),
        ("qwen3_coder", {"config": "[" * 100 + "]" * 100}, {"config": "[" * 100 + "]" * 100}),
        ("glm47", {"config": "[" * 5000 + "]" * 5000}, {"config": "[" * 5000 + "]" * 5000}),
        (
            "qwen3_coder",
            {"config": "{'a': " + "7" * 5000 + "}"},
            {"config": "{'a': " + "7" * 5000 + "}"},
        ),
    ],
)
def test_family_value_rules(dialect: str, args: dict[str, str], expected: dict[str, Any]) -> None:
    body = WRITERS[dialect]([("Odd", args)])
    ((_, got),) = calls_of(read(dialect, [body], tools=[ODD]))
    assert_typed(got, expected)


def test_dsml_string_attribute_decides_the_type() -> None:
    body = (
        '\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="location" string="true">Hangzhou</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="code" string="true">42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="opts" string="false">{"a": [1, true]}</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
    )
    expected = {"location": "Hangzhou", "days": 3, "code": "42", "opts": {"a": [1, True]}}
    assert calls_of(read("deepseek_v32", list(body), tools=[])) == [("get_weather", expected)]
    # Without the attribute the schema decides.
    body = write_dsml([("Odd", {"count": "3", "custom": "4"})]).replace(' string="true"', "")
    ((_, got),) = calls_of(read("deepseek_v32", [body], tools=[ODD]))
    assert_typed(got, {"count": 3, "custom": "4"})


def test_without_tools_values_follow_the_markup() -> None:
    body = write_qwen3_coder([("Bash", {"command": "ls", "timeout": "5"})])
    assert calls_of(read("qwen3_coder", [body], tools=[])) == [
        ("Bash", {"command": "ls", "timeout": "5"})
    ]


def test_only_parameter_dialects_have_readers() -> None:
    for name in DIALECT_NAMES:
        assert DIALECTS[name].arguments == "params"
        assert param_span_reader(name, []) is not None
    for name in ("json_tools", "kimi_k2", "mistral", "harmony"):
        assert param_span_reader(name, TOOLS) is None


# --- cost ----------------------------------------------------------------------------------------


def _feed_seconds(size: int, piece: int = 3) -> float:
    """Best of three: a `size`-character Write-like value fed `piece` characters at a time."""
    line = 'x = a < b and "</para" != "</param" > 0  # é\n'
    content = (line * (size // len(line) + 1))[:size]
    body = write_qwen3_coder([("Bash", {"command": content})])
    pieces = [body[i : i + piece] for i in range(0, len(body), piece)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        got = read("qwen3_coder", pieces)
        best = min(best, time.perf_counter() - start)
    assert calls_of(got) == [("Bash", {"command": content})]
    return best


def test_a_long_value_in_small_pieces_costs_linear_time() -> None:
    # Twenty times the text takes about twenty times as long when each feed looks only at the
    # new text; copying or re-scanning the value on every feed makes it about 200 times.
    small, large = _feed_seconds(5_000), _feed_seconds(100_000)
    assert large < 60 * small
