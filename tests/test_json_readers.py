"""Streaming span readers of the JSON-arguments families (json_readers.py).

Each family's real call text (`assistant_turn_as_rendered` of its fixture, cut to the span the
output parser hands over) must give the same call whether it arrives whole or one character at
a time; arguments stream as JSON only (no markup), end as valid JSON when cut off after the
call began, and a span that never became a call is given back (None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from mlxlaunch.engine.output.json_readers import json_span_reader, json_value_calls
from mlxlaunch.engine.output.spans import CallArgs, CallBegin, CallEnd, CallPiece, SpanReader
from mlxlaunch.store.dialects import DIALECTS

TEMPLATES = Path(__file__).parent / "fixtures" / "chat-templates"

# fixture family -> dialect
FIXTURES = {
    "qwen3-0.6b": "json_tools",
    "qwen2.5-7b-instruct": "json_tools",
    "kimi-k2-instruct-0905": "kimi_k2",
    "devstral-small-2507": "mistral",
    "mistral-small-3.2": "mistral",
    "ministral-3-reasoning": "mistral",
    "deepseek-v3.1": "deepseek_v31",
    "llama-3.3-70b": "llama3_json",
}
# Text of the families' markup: none of it may reach the arguments.
MARKUP = ("<|", "|>", "<｜", "｜>", "[ARGS]", "[CALL_ID]", "[TOOL_CALLS]", "```", "</")


def fixture_span(family: str) -> tuple[str, dict[str, Any]]:
    """The span the output parser hands the reader for this family's example call (the text
    between the dialect's markers; without an end marker, up to the end-of-turn token), and
    the example call."""
    facts = json.loads((TEMPLATES / f"{family}.tokens.json").read_text())
    call = facts["tool_call"]
    rendered, turn_end = call["assistant_turn_as_rendered"], call["turn_ends_with"]
    dialect = DIALECTS[FIXTURES[family]]
    assert dialect.tool_call_start is not None
    if dialect.tool_call_start in rendered:
        span = rendered.split(dialect.tool_call_start, 1)[1]
    else:  # Llama 3: the whole output is the call
        assert dialect.leading_call is not None
        span = rendered[rendered.index(dialect.leading_call) :]
    span = span.split(dialect.tool_call_end)[0] if dialect.tool_call_end else span
    return span.split(turn_end)[0], call["example"]


def read(dialect: str, pieces: list[str], complete: bool = True) -> list[CallPiece] | None:
    reader = reader_for(dialect)
    out: list[CallPiece] = []
    for piece in pieces:
        out += reader.feed(piece)
    closing = reader.close(complete)
    return None if closing is None else out + closing


def reader_for(dialect: str) -> SpanReader:
    factory = json_span_reader(dialect)
    assert factory is not None
    return factory()


def calls(pieces: list[CallPiece]) -> list[tuple[str, str | None, Any]]:
    """(name, model id, parsed arguments) per call, checking the piece grammar on the way:
    CallBegin, CallArgs*, CallEnd; the CallArgs concatenate to CallEnd.arguments, or to a
    prefix of it when the call is incomplete (the parser sends the repair, flagged)."""
    found: list[tuple[str, str | None, Any]] = []
    begin: CallBegin | None = None
    streamed: list[str] = []
    for piece in pieces:
        if isinstance(piece, CallBegin):
            assert begin is None, "a call began inside another"
            begin, streamed = piece, []
        elif isinstance(piece, CallArgs):
            assert begin is not None and piece.text
            assert not any(mark in piece.text for mark in MARKUP), piece.text
            streamed.append(piece.text)
        else:
            assert begin is not None, "a call ended that never began"
            if streamed and piece.complete:
                assert "".join(streamed) == piece.arguments
            elif streamed:
                assert piece.arguments.startswith("".join(streamed))
            arguments = json.loads(piece.arguments)
            assert isinstance(arguments, dict)
            found.append((begin.name, begin.model_id, arguments))
            begin = None
    assert begin is None, "a call never ended"
    return found


def split(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


# --- the families' own call text ------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_the_fixture_call_streams_the_same_whole_or_char_by_char(family: str) -> None:
    span, example = fixture_span(family)
    # The id only when the family writes it (Kimi's functions.Bash:0, Mistral's [CALL_ID]).
    model_id = example["id"] if example["id"] in span else None
    expected = [(example["name"], model_id, example["arguments"])]
    whole = read(FIXTURES[family], [span])
    by_char = read(FIXTURES[family], list(span))
    assert whole is not None and by_char is not None
    assert calls(whole) == calls(by_char) == expected
    for pieces in (whole, by_char):
        assert isinstance(pieces[0], CallBegin) and isinstance(pieces[-1], CallEnd)
        streamed = "".join(p.text for p in pieces if isinstance(p, CallArgs))
        assert streamed == pieces[-1].arguments  # streamed, not buffered
        assert streamed in span  # exactly the text the model wrote


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_the_call_begins_before_its_arguments_are_complete(family: str) -> None:
    span, example = fixture_span(family)
    opening = span.index('{"command"')
    reader = reader_for(FIXTURES[family])
    assert reader.feed(span[:opening]) == []
    assert not reader.committed
    pieces = reader.feed(span[opening : opening + 14])
    model_id = example["id"] if example["id"] in span else None
    assert pieces == [CallBegin("Bash", model_id), CallArgs('{"command": "l')]
    assert reader.committed


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_a_fixture_call_cut_anywhere_is_repaired_or_given_back(family: str) -> None:
    span, _ = fixture_span(family)
    dialect = FIXTURES[family]
    arguments_start = span.index('{"command"')
    for cut in range(len(span) + 1):
        pieces = read(dialect, list(span[:cut]), complete=False)
        if cut <= arguments_start:
            assert pieces is None, cut  # nothing was committed: the parser shows the text
        else:
            assert pieces is not None, cut
            [(name, _, arguments)] = calls(pieces)
            assert name == "Bash" and isinstance(arguments, dict)


# --- several calls in one span --------------------------------------------------------------


def two_calls(dialect: str, first: str, second: str) -> str:
    """A span with a Bash call (arguments `first`) and a Read call (`second`)."""
    if dialect == "json_tools":
        return (
            f'\n{{"name": "Bash", "arguments": {first}}}\n'
            f'{{"name": "Read", "arguments": {second}}}\n'
        )
    if dialect == "llama3_json":
        return (
            f'{{"name": "Bash", "parameters": {first}}}; {{"name": "Read", "parameters": {second}}}'
        )
    if dialect == "kimi_k2":
        return (
            f"<|tool_call_begin|>functions.Bash:0<|tool_call_argument_begin|>{first}"
            f"<|tool_call_end|>\n<|tool_call_begin|>functions.Read:1<|tool_call_argument_begin|>"
            f"{second}<|tool_call_end|>"
        )
    if dialect == "mistral":
        return (
            f"Bash[CALL_ID]a1b2c3d4e[ARGS]{first}[TOOL_CALLS]Read[CALL_ID]Z9y8X7w6V[ARGS]{second}"
        )
    assert dialect == "deepseek_v31"
    return (
        f"<｜tool▁call▁begin｜>Bash<｜tool▁sep｜>{first}<｜tool▁call▁end｜>\n"
        f"<｜tool▁call▁begin｜>Read<｜tool▁sep｜>{second}<｜tool▁call▁end｜>"
    )


WRITTEN_IDS = {
    "kimi_k2": ("functions.Bash:0", "functions.Read:1"),
    "mistral": ("a1b2c3d4e", "Z9y8X7w6V"),
}
JSON_DIALECTS = sorted({*FIXTURES.values()})

# Random text, minus the characters markup is made of (so a leak check stays meaningful).
_plain = st.text(alphabet=st.characters(blacklist_characters="<>|｜[]`"), max_size=10)
_arguments = st.dictionaries(
    _plain,
    st.recursive(
        st.none() | st.booleans() | st.integers() | _plain,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_plain, inner),
        max_leaves=8,
    ),
    max_size=4,
)


@pytest.mark.parametrize("dialect", JSON_DIALECTS)
def test_two_calls_in_one_span(dialect: str) -> None:
    span = two_calls(dialect, '{"command": "ls"}', '{"file_path": "/a/b.py", "limit": 10}')
    ids = WRITTEN_IDS.get(dialect, (None, None))
    expected = [
        ("Bash", ids[0], {"command": "ls"}),
        ("Read", ids[1], {"file_path": "/a/b.py", "limit": 10}),
    ]
    for pieces in (read(dialect, [span]), read(dialect, list(span))):
        assert pieces is not None
        assert calls(pieces) == expected
    # The first call is complete as soon as its arguments close.
    reader = reader_for(dialect)
    first_end = span.index('"ls"}') + 5
    assert isinstance(reader.feed(span[:first_end])[-1], CallEnd)


@settings(max_examples=examples(60), deadline=None)
@given(
    dialect=st.sampled_from(JSON_DIALECTS),
    first=_arguments,
    second=_arguments,
    ensure_ascii=st.booleans(),
    data=st.data(),
)
def test_random_arguments_and_splits_read_the_same(
    dialect: str, first: dict[str, Any], second: dict[str, Any], ensure_ascii: bool, data: Any
) -> None:
    texts = [json.dumps(args, ensure_ascii=ensure_ascii) for args in (first, second)]
    span = two_calls(dialect, *texts)
    pieces = read(dialect, split(span, data))
    assert pieces is not None
    ids = WRITTEN_IDS.get(dialect, (None, None))
    assert calls(pieces) == [("Bash", ids[0], first), ("Read", ids[1], second)]
    ends = [p.arguments for p in pieces if isinstance(p, CallEnd)]
    assert ends == texts  # the arguments as the model wrote them


@settings(max_examples=examples(60), deadline=None)
@given(dialect=st.sampled_from(JSON_DIALECTS), args=_arguments, data=st.data())
def test_a_random_cut_after_the_call_began_ends_with_valid_json(
    dialect: str, args: dict[str, Any], data: Any
) -> None:
    span = two_calls(dialect, json.dumps(args), '{"a": [1, 2]}')
    cut = data.draw(st.integers(span.index("{", span.index("Bash")) + 1, len(span)))
    reader = reader_for(dialect)
    pieces = [p for piece in split(span[:cut], data) for p in reader.feed(piece)]
    assert reader.committed
    closing = reader.close(data.draw(st.booleans()))
    assert closing is not None
    assert calls(pieces + closing)[0][0] == "Bash"


# --- spans that are no call --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "span"),
    [
        ("json_tools", "\nnot json at all\n"),
        ("json_tools", '{"name": 12, "arguments": {}}'),
        ("json_tools", '{"name": "  ", "arguments": {"a": 1}}'),
        ("json_tools", '{"name": "Bash", "arguments": [1, 2]}'),
        ("json_tools", '{"name": "Bash", "arguments": "not an object"}'),
        ("llama3_json", 'brave_search.call(query="weather")'),  # a built-in tool, not JSON
        ("kimi_k2", '<|tool_call_begin|>functions.Bash:0 {"a": 1}<|tool_call_end|>'),
        ("kimi_k2", '<|tool_call_begin|><|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>'),
        ("mistral", 'Bash{"a": 1}'),
        ("mistral", '[{"name": 1, "arguments": {}}]'),
        ("mistral", "Bash[ARGS][1]"),
        ("deepseek_v31", '<｜tool▁call▁begin｜><｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>'),
        ("deepseek_v31", "<｜tool▁call▁begin｜>Bash<｜tool▁sep｜>ls<｜tool▁call▁end｜>"),
    ],
)
def test_an_unreadable_span_is_given_back(dialect: str, span: str) -> None:
    for pieces in ([span], list(span)):
        reader = reader_for(dialect)
        assert [p for piece in pieces for p in reader.feed(piece)] == []
        assert not reader.committed
        assert reader.close(True) is None
    assert read(dialect, [span], complete=False) is None


def test_arguments_that_break_after_the_call_began_end_with_what_was_valid() -> None:
    reader = reader_for("json_tools")
    pieces = reader.feed('{"name": "Bash", "arguments": {"command": "ls", "x": "a\\q"}}')
    pieces += reader.feed('\n{"name": "Read", "arguments": {}}')  # after the damage: dropped
    closing = reader.close(True)
    assert closing == []
    assert calls(pieces) == [("Bash", None, {"command": "ls", "x": "a"})]


def test_text_after_a_streamed_call_that_is_no_call_is_dropped() -> None:
    pieces = read("mistral", ['Bash[ARGS]{"command": "ls"}  and then some words'])
    assert pieces is not None and calls(pieces) == [("Bash", None, {"command": "ls"})]


# --- family details ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "expected"),
    [
        # "arguments" before "name": read whole at close.
        ('\n{"arguments": {"command": "ls"}, "name": "Bash"}\n', ("Bash", {"command": "ls"})),
        # Arguments written as a JSON string.
        ('{"name": "Bash", "arguments": "{\\"command\\": \\"ls\\"}"}', ("Bash", {"command": "ls"})),
        # "parameters" and a name with whitespace around it (streamed).
        ('{"name": " Bash\\n", "parameters": {"command": "ls"}}', ("Bash", {"command": "ls"})),
        # Other members before the name and after the arguments.
        (
            '{"type": "function", "name": "Bash", "arguments": {"command": "ls"}, "id": 1}',
            ("Bash", {"command": "ls"}),
        ),
        ('{"name": "Bash"}', ("Bash", {})),  # no arguments at all
    ],
)
def test_hermes_json_variants(span: str, expected: tuple[str, dict[str, Any]]) -> None:
    for pieces in (read("json_tools", [span]), read("json_tools", list(span))):
        assert pieces is not None
        assert [(name, args) for name, _, args in calls(pieces)] == [expected]


def test_hermes_json_that_cannot_stream_is_given_back_when_cut_off() -> None:
    assert read("json_tools", ['{"arguments": {"command": "ls"}, "name": "Ba'], False) is None


def test_a_streamed_call_then_one_read_whole() -> None:
    span = '{"name": "Bash", "arguments": {"a": 1}}\n{"arguments": {"b": 2}, "name": "Read"}'
    pieces = read("json_tools", list(span))
    assert pieces is not None
    assert calls(pieces) == [("Bash", None, {"a": 1}), ("Read", None, {"b": 2})]
    assert isinstance(pieces[1], CallArgs)  # the first one streamed


@pytest.mark.parametrize(
    ("written", "name", "model_id"),
    [
        ("functions.Bash:0", "Bash", "functions.Bash:0"),
        (
            "functions.mcp__ide__getDiagnostics:12",
            "mcp__ide__getDiagnostics",
            "functions.mcp__ide__getDiagnostics:12",
        ),
        ("Bash:3", "Bash", "Bash:3"),
        (" Bash ", "Bash", None),  # a bare name is no id: two calls would share it
    ],
)
def test_kimi_names_and_ids(written: str, name: str, model_id: str | None) -> None:
    span = f'<|tool_call_begin|>{written}<|tool_call_argument_begin|>{{"a": 1}}<|tool_call_end|>'
    pieces = read("kimi_k2", list(span))
    assert pieces is not None and calls(pieces) == [(name, model_id, {"a": 1})]


def test_mistral_call_id_is_the_id_and_not_the_name() -> None:
    # mlx-lm's parser reads `a1b2c3d4e[ARGS]` as the name; the name is what precedes [CALL_ID].
    pieces = read("mistral", ['Bash[CALL_ID]a1b2c3d4e[ARGS]{"command": "ls"}'])
    assert pieces is not None and calls(pieces) == [("Bash", "a1b2c3d4e", {"command": "ls"})]


def test_mistral_json_list_form_is_read_whole() -> None:
    span = (
        '[{"name": "Bash", "arguments": {"command": "ls"}, "id": "a1b2c3d4e"},'
        ' {"name": "Read", "arguments": "{\\"file_path\\": \\"/x\\"}"}]'
    )
    pieces = read("mistral", list(span))
    assert pieces == [
        CallBegin("Bash", "a1b2c3d4e"),
        CallEnd('{"command": "ls"}'),
        CallBegin("Read", None),
        CallEnd('{"file_path": "/x"}'),
    ]
    assert read("mistral", [span[:-5]], complete=False) is None


def test_mistral_list_form_after_a_streamed_call() -> None:
    span = 'Bash[ARGS]{"a": 1}[TOOL_CALLS][{"name": "Read", "arguments": {"b": 2}}]'
    pieces = read("mistral", list(span))
    assert pieces is not None
    assert calls(pieces) == [("Bash", None, {"a": 1}), ("Read", None, {"b": 2})]


def test_deepseek_v3_fenced_form() -> None:
    span = (
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>Bash\n```json\n"
        '{"command": "ls"}\n```<｜tool▁call▁end｜>\n'
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>Read\n```json\n"
        '{"file_path": "/x"}\n```<｜tool▁call▁end｜>'
    )
    for pieces in (read("deepseek_v31", [span]), read("deepseek_v31", list(span))):
        assert pieces is not None
        assert calls(pieces) == [
            ("Bash", None, {"command": "ls"}),
            ("Read", None, {"file_path": "/x"}),
        ]


@pytest.mark.parametrize("separator", ["; ", ";", "\n", "\n\n", " "])
def test_llama_calls_separated_by_semicolons_or_newlines(separator: str) -> None:
    span = f'{{"type": "function", "name": "Bash", "parameters": {{"command": "ls"}}}}{separator}'
    span += '{"name": "Read", "arguments": {}}'
    pieces = read("llama3_json", list(span))
    assert pieces is not None
    assert calls(pieces) == [("Bash", None, {"command": "ls"}), ("Read", None, {})]


def test_json_value_calls_reads_objects_and_lists() -> None:
    parsed = json_value_calls('{"name": "A", "arguments": {}}; [{"function": {"name": "B"}}]')
    assert parsed is not None and [(c.name, c.arguments) for c in parsed] == [
        ("A", "{}"),
        ("B", "{}"),
    ]
    assert json_value_calls('{"name": "A", "arguments": {"x": NaN}}') is None
    assert json_value_calls("") is None


def test_factory_covers_the_json_dialects_only() -> None:
    for name in JSON_DIALECTS:
        factory = json_span_reader(name)
        assert factory is not None and factory() is not factory()
    for name in ("qwen3_coder", "glm47", "minimax_m2", "harmony", "deepseek_v32", "unknown"):
        assert json_span_reader(name) is None
