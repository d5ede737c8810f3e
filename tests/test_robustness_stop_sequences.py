"""Issue 19, item 8: stop sequences at the limit cost memory and time linear in their length.

256 stop sequences of 1,000 characters used to cost ~150 MB a request (the marker matcher kept
every proper prefix of every marker: O(total length²)); 16 such requests pushed the server from
130 MB to 1.3 GB. Matching must stay exact: earliest-ending stop wins, stops split across pieces
still match, held-back text is only what could still become a stop, and stops apply to text only.
Their total length is also bounded at the protocol (a 400 naming `stop_sequences`).
"""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from pydantic import ValidationError

from mlxlaunch.engine.output.harmony import HarmonyParser
from mlxlaunch.engine.output.markers import MarkerKind, MarkerSet
from mlxlaunch.engine.output.parser import OutputParser, ParserConfig
from mlxlaunch.engine.types import TextDelta, ThinkingDelta
from mlxlaunch.protocol import limits
from mlxlaunch.protocol.errors import describe_validation_error
from mlxlaunch.protocol.requests import MAX_STOP_SEQUENCES_TOTAL_CHARS, MessagesRequest

MAX_BYTES_PER_REQUEST = 5 * 1024 * 1024


def at_the_limit(seed: int = 0, alphabet: str = "ab") -> list[str]:
    """The most and longest stop sequences a request could once send, over a tiny alphabet so
    that output keeps matching their prefixes."""
    rng = random.Random(seed)
    return [
        "".join(rng.choice(alphabet) for _ in range(limits.MAX_STOP_SEQUENCE_CHARS))
        for _ in range(limits.MAX_STOP_SEQUENCES)
    ]


def qwen_like(stops: list[str]) -> ParserConfig:
    return ParserConfig(
        think_start="<think>",
        think_end="</think>",
        tool_call_start="<tool_call>",
        tool_call_end="</tool_call>",
        stop_sequences=stops,
    )


def pieces_of(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def text_of(events: Iterable[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def thinking_of(events: Iterable[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, ThinkingDelta))


def peak_bytes(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("parser_class", [OutputParser, HarmonyParser])
def test_stop_sequences_at_the_limit_take_little_memory(parser_class: type) -> None:
    stops = at_the_limit()
    output = at_the_limit(seed=1)[0] * 3  # keeps running along the stops' prefixes

    def serve_one_request() -> None:
        parser = parser_class(qwen_like(stops))
        for piece in pieces_of(output, 4):
            parser.feed(piece)
        parser.finish()

    peak = peak_bytes(serve_one_request)
    assert peak < MAX_BYTES_PER_REQUEST, f"{peak / 1e6:.1f} MB for one request's stop sequences"


def test_a_marker_set_holds_its_markers_and_little_else() -> None:
    stops = at_the_limit()
    total = sum(len(stop) for stop in stops)
    peak = peak_bytes(lambda: MarkerSet([(stop, MarkerKind.STOP) for stop in stops]))
    assert peak < 8 * total + 64 * len(stops)  # references and a sort, not prefix tables


# --- matching stays exact --------------------------------------------------------------------


def reference_held_back(buffer: str, markers: list[str]) -> int:
    """Longest suffix of `buffer` that is a proper prefix of a marker (brute force)."""
    for size in range(len(buffer), 0, -1):
        if any(len(m) > size and m.startswith(buffer[-size:]) for m in markers):
            return size
    return 0


def reference_first_match(buffer: str, markers: list[str]) -> tuple[int, int, str] | None:
    """(start, end, marker) completing earliest; ties: the one that starts earlier."""
    found = [
        (start + len(m), start, m)
        for m in markers
        for start in range(len(buffer) - len(m) + 1)
        if buffer.startswith(m, start)
    ]
    if not found:
        return None
    end, start, marker = min(found, key=lambda f: (f[0], f[1]))
    return start, end, marker


@settings(max_examples=examples(300), deadline=None)
@given(
    markers=st.lists(st.text("abc", min_size=1, max_size=6), min_size=1, max_size=6, unique=True),
    buffer=st.text("abc", max_size=14),
)
def test_marker_set_agrees_with_brute_force(markers: list[str], buffer: str) -> None:
    marker_set = MarkerSet([(m, MarkerKind.STOP) for m in markers])
    match = marker_set.first_match(buffer)
    expected = reference_first_match(buffer, markers)
    if expected is None:
        assert match is None
        assert marker_set.held_back(buffer) == reference_held_back(buffer, markers)
    else:
        assert match is not None
        assert (match.start, match.end) == expected[:2]
        assert buffer[match.start : match.end] == match.marker


@settings(max_examples=examples(200), deadline=None)
@given(
    stops=st.lists(st.text("ab", min_size=1, max_size=8), min_size=1, max_size=5, unique=True),
    output=st.text("ab", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_text_is_held_back_only_while_it_could_still_become_a_stop(
    stops: list[str], output: str, cuts: list[int]
) -> None:
    """In any split: the text sent so far is the output so far less the longest tail that could
    still grow into a stop; the end is the earliest-ending stop and the text before it."""
    bounds = sorted({0, len(output), *(c for c in cuts if c <= len(output))})
    parser = OutputParser(qwen_like(stops))
    sent = ""
    for start, end in itertools.pairwise(bounds):
        sent += text_of(parser.feed(output[start:end]))
        seen = output[:end]
        if parser.stopped:
            break
        assert sent == seen[: len(seen) - reference_held_back(seen, stops)]
    sent += text_of(parser.finish())
    expected = reference_first_match(output, stops)
    if expected is None:
        assert not parser.stopped and sent == output
    else:
        assert parser.stopped_by == expected[2] and sent == output[: expected[0]]


def test_a_stop_at_the_limit_matches_when_split_across_pieces_among_near_misses() -> None:
    stops = at_the_limit()
    target = stops[137]
    # Output that first runs along many stops' prefixes and breaks off, then writes one whole.
    near_misses = "".join(stop[:900] + "c" for stop in stops[:20])
    output = "Intro " + near_misses + target + " after"
    for size in (1, 3, 7, 1000):
        parser = OutputParser(qwen_like(stops))
        events = [e for piece in pieces_of(output, size) for e in parser.feed(piece)]
        events += parser.finish()
        assert parser.stopped_by == target, size
        assert text_of(events) == "Intro " + near_misses


def test_overlapping_stops_end_at_the_one_that_completes_first() -> None:
    # "bcab" completes at the 5th character, "abcabd" at the 6th: a token-by-token stream sees
    # "bcab" first, whatever the pieces.
    for size in (1, 2, 6):
        parser = OutputParser(qwen_like(["abcabd", "bcab", "cabd"]))
        events = [e for piece in pieces_of("xabcabd", size) for e in parser.feed(piece)]
        assert parser.stopped_by == "bcab"
        assert text_of(events) == "xa"


def test_long_stops_do_not_apply_inside_thinking() -> None:
    stops = at_the_limit()
    output = f"<think>plan {stops[5]} more</think>Answer {stops[5]} rest"
    for size in (1, 5, len(output)):
        parser = OutputParser(qwen_like(stops))
        events = [e for piece in pieces_of(output, size) for e in parser.feed(piece)]
        events += parser.finish()
        assert parser.stopped_by == stops[5]
        assert thinking_of(events) == f"plan {stops[5]} more"
        assert text_of(events) == "Answer "


def test_harmony_applies_long_stops_to_the_final_channel_only() -> None:
    stops = at_the_limit()
    output = (
        f"<|channel|>analysis<|message|>think {stops[9]}<|end|><|start|>assistant"
        f"<|channel|>final<|message|>Answer: {stops[9]} and more"
    )
    for size in (1, 9, len(output)):
        parser = HarmonyParser(ParserConfig(stop_sequences=stops))
        events = [e for piece in pieces_of(output, size) for e in parser.feed(piece)]
        events += parser.finish()
        assert parser.stopped_by == stops[9]
        assert thinking_of(events) == f"think {stops[9]}"
        assert text_of(events) == "Answer: "


# --- the protocol bound ------------------------------------------------------------------------

BODY = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_stop_sequences_up_to_the_total_are_accepted() -> None:
    per_stop = MAX_STOP_SEQUENCES_TOTAL_CHARS // limits.MAX_STOP_SEQUENCES
    stops = ["x" * per_stop] * limits.MAX_STOP_SEQUENCES
    assert MessagesRequest.model_validate({**BODY, "stop_sequences": stops}).stop_sequences


def test_stop_sequences_beyond_the_total_are_refused_naming_the_field() -> None:
    raw = {**BODY, "stop_sequences": at_the_limit()}  # the request of the issue
    with pytest.raises(ValidationError) as caught:
        MessagesRequest.model_validate(raw)
    message = describe_validation_error(caught.value, raw)
    assert message.startswith("stop_sequences: ")
    assert str(MAX_STOP_SEQUENCES_TOTAL_CHARS) in message
