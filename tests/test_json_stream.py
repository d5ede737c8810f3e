"""JsonObjectStream: forward a JSON object as it streams in, repair it when it is cut off.

The properties (hypothesis): a whole object comes through unchanged whatever the split; any
truncation, repaired by `close()`, parses to a dict; arbitrary text never raises and never
forwards more than a valid prefix. The examples pin down what is held back and why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from mlxlaunch.engine.output.json_stream import JsonObjectStream

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
)
_objects = st.dictionaries(st.text(max_size=8), _values, max_size=5)
_dump_options = st.fixed_dictionaries(
    {
        "ensure_ascii": st.booleans(),  # True: non-ASCII as \u escapes, surrogate pairs included
        "indent": st.none() | st.integers(0, 2),
        "separators": st.sampled_from([None, (",", ":"), (", ", ": ")]),
    }
)
_json_texts = st.builds(lambda obj, options: json.dumps(obj, **options), _objects, _dump_options)
# Text made mostly of JSON's own characters, so it often gets some way into the grammar.
_garbage = st.text(
    alphabet=st.sampled_from(list('{}[]":, \n\\u0123456789abcdefE.+-trufalsn')) | st.characters(),
    max_size=40,
)


def split(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def stream(pieces: list[str]) -> tuple[JsonObjectStream, str]:
    scanner = JsonObjectStream()
    forwarded = "".join(scanner.feed(piece) for piece in pieces)
    return scanner, forwarded


def repaired(pieces: list[str]) -> Any:
    scanner, forwarded = stream(pieces)
    return json.loads(forwarded + scanner.close())


# --- properties --------------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(text=_json_texts, lead=st.sampled_from(["", " ", "\n\t "]), data=st.data())
def test_a_whole_object_comes_through_unchanged(text: str, lead: str, data: st.DataObject) -> None:
    after = data.draw(st.sampled_from(["", "\n", "}</tool_call>", '{"next": 1}']))
    scanner, forwarded = stream(split(lead + text + after, data))
    assert forwarded == text
    assert scanner.done and not scanner.broken
    assert scanner.rest == after
    assert scanner.close() == ""


@settings(max_examples=examples(250), deadline=None)
@given(text=_json_texts, data=st.data())
def test_any_truncation_repairs_to_an_object(text: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(1, len(text)))
    scanner, forwarded = stream(split(text[:cut], data))
    assert text.startswith(forwarded)
    value = json.loads(forwarded + scanner.close())
    assert isinstance(value, dict)
    assert not scanner.broken


@settings(max_examples=examples(250), deadline=None)
@given(text=_garbage | _json_texts, data=st.data())
def test_arbitrary_text_never_raises_and_forwards_a_valid_prefix(
    text: str, data: st.DataObject
) -> None:
    scanner, forwarded = stream(split(text, data))
    assert text.lstrip(" \t\n\r").startswith(forwarded)
    if scanner.started:
        assert isinstance(json.loads(forwarded + scanner.close()), dict)
    else:
        assert forwarded == "" and scanner.close() == ""


@settings(max_examples=examples(300), deadline=None)
@given(text=_json_texts, data=st.data())
def test_a_corrupted_object_is_forwarded_up_to_the_damage(text: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(1, len(text)))
    inserted = data.draw(st.sampled_from(list('{}[]":,\\x0-.e\x01')))
    corrupted = text[:at] + inserted + text[at:]
    whole, forwarded_whole = stream([corrupted])
    pieces, forwarded_pieces = stream(split(corrupted, data))
    # The split does not matter, and what was forwarded is a prefix that repairs to a dict.
    assert forwarded_pieces == forwarded_whole
    assert pieces.close() == whole.close()
    assert (pieces.done, pieces.broken, pieces.rest) == (whole.done, whole.broken, whole.rest)
    assert corrupted.startswith(forwarded_whole)
    assert isinstance(json.loads(forwarded_whole + whole.close()), dict)


# --- what is held back ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "forwarded", "repair"),
    [
        ('{"a": "x\\', '{"a": "x', '"}'),  # half escape
        ('{"a": "x\\u00e', '{"a": "x', '"}'),  # half \u escape
        ('{"a": "x\\n', '{"a": "x\\n', '"}'),  # a complete escape goes through
        ('{"a": "\\ud83d', '{"a": "', '"}'),  # a high surrogate waits for its pair
        ('{"a": "\\ud83d\\ude00', '{"a": "\\ud83d\\ude00', '"}'),
        ('{"a": tru', "{", "}"),  # half literal
        ('{"a": true', '{"a": true', "}"),
        ('{"a": -', "{", "}"),  # numbers that cannot end here
        ('{"a": 1.', '{"a": 1', "}"),
        ('{"a": 1.5e', '{"a": 1.5', "}"),
        ('{"a": 1.5e+', '{"a": 1.5', "}"),
        ('{"a": 12', '{"a": 12', "}"),  # a number that can end here goes through
        ('{"a": 1, "b"', '{"a": 1', "}"),  # dangling key
        ('{"a": 1, "b": ', '{"a": 1', "}"),
        ('{"a": 1, "b', '{"a": 1', "}"),
        ('{"a": 1,', '{"a": 1', "}"),  # trailing comma
        ('{"a": [1, ', '{"a": [1', "]}"),
        ('{"a": [', '{"a": [', "]}"),  # an opened container is a value
        ('{"a": {"b": [{"c', '{"a": {"b": [{', "}]}}"),
        ('{"a": "', '{"a": "', '"}'),
        ("{", "{", "}"),
    ],
)
def test_a_cut_holds_back_what_could_not_end_there(text: str, forwarded: str, repair: str) -> None:
    for pieces in ([text], list(text)):
        scanner, sent = stream(pieces)
        assert (sent, scanner.close()) == (forwarded, repair)
        assert isinstance(json.loads(sent + repair), dict)


def test_leading_whitespace_is_skipped_and_text_after_the_object_is_rest() -> None:
    scanner = JsonObjectStream()
    assert scanner.feed("\n  ") == ""
    assert scanner.feed('{"a": [1, {"b": null}]}\n</tool_call>') == '{"a": [1, {"b": null}]}'
    assert scanner.done and scanner.rest == "\n</tool_call>"
    assert scanner.feed("more") == ""
    assert scanner.rest == "\n</tool_call>more"


@pytest.mark.parametrize("text", ["x{}", "[1]", '"a"', "}", "\ufeff{}"])
def test_text_that_does_not_open_an_object_forwards_nothing(text: str) -> None:
    scanner, forwarded = stream(list(text))
    assert forwarded == "" and scanner.broken and not scanner.started
    assert scanner.close() == ""


@pytest.mark.parametrize(
    ("text", "forwarded", "rest"),
    [
        ('{"a": 01}', '{"a": 0', "1}"),
        ('{"a": "b\nc"}', '{"a": "b', '\nc"}'),  # raw control characters are not JSON
        ('{"a": "\\q"}', '{"a": "', 'q"}'),
        ('{"a": 1,}', '{"a": 1', "}"),
        ('{"a" 1}', "{", "1}"),
        ('{"a": NaN}', "{", "NaN}"),
        ('{"a": [1}', '{"a": [1', "}"),
        ('{"a": "\\u12g4"}', '{"a": "', 'g4"}'),
        ("{'a': 1}", "{", "'a': 1}"),
    ],
)
def test_invalid_json_breaks_the_stream_and_holds_the_rest(
    text: str, forwarded: str, rest: str
) -> None:
    scanner, sent = stream(list(text))
    assert sent == forwarded
    assert scanner.broken and not scanner.done
    assert scanner.rest == rest
    assert scanner.feed("later") == ""
    assert isinstance(json.loads(sent + scanner.close()), dict)


def test_long_strings_and_keys_stream_in_linear_time() -> None:
    # 200k characters one at a time, half in a key (held until its value starts): a scanner
    # that re-read what it holds would take minutes here.
    key, value = "k" * 100_000, "v" * 100_000
    text = json.dumps({key: value})
    scanner = JsonObjectStream()
    sent = [scanner.feed(c) for c in text]
    assert "".join(sent) == text and scanner.done
    assert all(piece == "" for piece in sent[1 : len(key) + 4])  # the key waited for its value


# What no reader holds (issue 35, item 7): the stream breaks at the character that would make
# it so, and what was forwarded before it reads back in Python (and in jiter, the Anthropic
# SDK's reader) once repaired.
_BIG = "7" * 5000


@pytest.mark.parametrize(
    ("text", "forwarded"),
    [
        ('{"n": ' + _BIG + "}", '{"n": ' + "7" * 4300),  # past int()'s 4,300 digits
        ('{"n": -' + _BIG + ', "m": 1}', '{"n": -' + "7" * 4300),
        ('{"n": 1e400}', '{"n": 1e40'),  # past the largest float: Python's inf
        ('{"n": 1.8e308}', '{"n": 1.8e30'),
        ('{"n": ' + "7" * 400 + ".5}", '{"n": ' + "7" * 400),  # an int, but no float
        ('{"a": ' + "[" * 60 + "]" * 60 + "}", '{"a": ' + "[" * 47),  # nested past MAX_DEPTH
    ],
    ids=["huge-int", "huge-negative-int", "1e400", "1.8e308", "int-then-float", "deep"],
)
def test_a_value_no_reader_holds_breaks_the_stream(text: str, forwarded: str) -> None:
    import jiter

    scanner, sent = stream([text[i : i + 7] for i in range(0, len(text), 7)])
    assert scanner.broken and sent == forwarded
    whole = sent + scanner.close()
    assert isinstance(json.loads(whole), dict)
    assert json.loads(json.dumps(json.loads(whole), allow_nan=False)) == json.loads(whole)
    jiter.from_json(whole.encode())


@pytest.mark.parametrize(
    "text",
    [
        '{"n": ' + "7" * 4300 + "}",
        '{"n": 1.7976931348623157e308, "m": 1e-400, "k": -0.5E+3, "j": 0.' + "0" * 400 + "1e400}",
        '{"a": ' + "[" * 47 + "]" * 47 + "}",
    ],
    ids=["4300-digits", "extreme-floats", "depth-48"],
)
def test_values_every_reader_holds_stream_whole(text: str) -> None:
    scanner, sent = stream(list(text))
    assert scanner.done and sent == text


def test_whole_calls_are_held_to_the_same_rule() -> None:
    from mlxlaunch.engine.output.spans import arguments_text

    assert arguments_text({"n": int("7" * 4300)}) is not None
    assert arguments_text('{"n": ' + "7" * 4301 + "}") is None  # int() refuses it
    assert arguments_text({"n": float("inf")}) is None
    deep: Any = 1
    for _ in range(60):
        deep = [deep]
    assert arguments_text({"a": deep}) is None
    assert arguments_text("[" * 100_000 + "]" * 100_000) is None  # RecursionError, caught


def test_the_depth_bound_fits_a_call_sent_back_in_a_messages_body() -> None:
    from mlxlaunch.engine.output.json_stream import MAX_DEPTH
    from mlxlaunch.protocol.limits import MAX_JSON_DEPTH

    # body → messages → message → content → block → input: the arguments start at level 6.
    assert MAX_DEPTH + 5 <= MAX_JSON_DEPTH
