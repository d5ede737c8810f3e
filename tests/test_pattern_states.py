"""`pattern_states`: a schema pattern whose lexer may need exponentially many states is told
apart from the patterns tools write, by its shape alone (issue 35, item 8).

`.*a.{100}` was admitted and then failed on the worker ("too many states", a 500); the
estimate refuses it before admission. The patterns real tool schemas carry (anchored or not,
counted parts, alternatives, loops that end where what follows begins) stay well inside."""

from __future__ import annotations

import time

import pytest

from mlxlaunch.engine.decoding.pattern_states import (
    MAX_GROUP_DEPTH,
    PatternTooNested,
    pattern_states,
)
from mlxlaunch.engine.decoding.schema_limits import MAX_PATTERN_STATES, check_grammar_inputs
from mlxlaunch.engine.types import InvalidRequest

EXPLODING = [
    "^.*a.{100}$",  # the shape: which of the last 100 characters was an `a`
    "a.{100}",  # unanchored: JSON Schema searches, an implicit `.*` before it
    "^[ab]*a[ab]{20}$",
    "^(.*a.{100})*$",  # inside a group
    "\\d[0-9a-f]{20}",  # a digit somewhere in the last 20 hex characters
    ".*(b|a.{20})",  # in one alternative
    "^x+y*.*\\d.{30}$",
]
TOOL_PATTERNS = [
    "^wf_[a-z0-9-]{6,}$",  # from a captured Claude Code request
    "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "[0-9]{4}-[0-9]{2}-[0-9]{2}",
    "\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}",
    "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "^https?://",
    "https?://[^\\s]{1,200}",  # what follows the shortest match is accepted
    "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\.)+[a-z]{2,}$",
    "^[a-z]+(-[a-z0-9]{1,63})*$",
    ".*\\.[a-z]{2,63}",
    "^\\d+\\.\\d+\\.\\d+(-[0-9A-Za-z.-]+)?$",
    "^[A-Za-z0-9+/]*={0,2}$",
    "^(\\d+(\\.\\d+)?)(,\\d+(\\.\\d+)?)*$",
    "[A-Z]{2}[0-9]{6}",
    "^(a|b|c|d|e|f|g|h|i|j){1000}$",
    "^\\p{L}+$",
    "(?i)^[a-z_]+$",
    "^(?P<name>[a-z]+)=(?:[0-9]+)$",
    "[a-z]{20}",
    "x" * 5000,
]


@pytest.mark.parametrize("pattern", EXPLODING)
def test_exploding_patterns_are_over_the_bound(pattern: str) -> None:
    assert pattern_states(pattern) > MAX_PATTERN_STATES


@pytest.mark.parametrize("pattern", TOOL_PATTERNS)
def test_the_patterns_tools_write_are_well_inside(pattern: str) -> None:
    assert pattern_states(pattern) <= max(100, len(pattern) + 2)


def test_the_bound_sits_between_neighbours() -> None:
    assert pattern_states(".*a.{12}") <= MAX_PATTERN_STATES < pattern_states(".*a.{13}")


@pytest.mark.parametrize(
    "pattern", ["[", "(", "a{", "\\", "x**", "a{1,", ")", "[]a]", "a{99999999999}", "[z-a]", ""]
)
def test_broken_patterns_never_raise(pattern: str) -> None:
    assert pattern_states(pattern) >= 1


def test_deep_groups_are_refused_without_recursing() -> None:
    with pytest.raises(PatternTooNested):
        pattern_states("(" * (MAX_GROUP_DEPTH + 2) + ")" * (MAX_GROUP_DEPTH + 2))
    schema = {"properties": {"a": {"pattern": "(" * 10_000}}}
    with pytest.raises(InvalidRequest, match=r"s\.properties\.a\.pattern: pattern too complex"):
        check_grammar_inputs([("s", schema)])


def test_the_walk_is_linear_in_the_pattern() -> None:
    for hostile in ("{" * 9000, "\\p{" * 9000, "[a" * 100_000, "a*" * 5000, "(ab|cd)" * 1400):
        start = time.process_time()
        pattern_states(hostile)
        assert time.process_time() - start < 1.0, hostile[:10]


def test_patterns_add_up_across_a_schema() -> None:
    twelve = {"type": "string", "pattern": ".*a.{11}"}  # ~4k states each
    check_grammar_inputs([("s", {"properties": {"a": twelve, "b": twelve}})])
    with pytest.raises(InvalidRequest, match=r"s\.properties\.[abc]\.pattern: pattern too complex"):
        check_grammar_inputs([("s", {"properties": {"a": twelve, "b": twelve, "c": twelve}})])
