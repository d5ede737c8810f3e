"""Dialect detection: every real template's tool-call syntax is found from its own text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxlaunch.store.dialects import DIALECTS, detect_dialect, dialect_named
from mlxlaunch.store.facts import infer_tool_format

TEMPLATES = sorted((Path(__file__).parent / "fixtures" / "chat-templates").glob("*.jinja"))


def facts_of(template: Path) -> dict:
    return json.loads(template.with_suffix(".tokens.json").read_text())


def vocab_of(facts: dict) -> set[str]:
    return set(facts["special_tokens"]) | set(facts["added_tokens_not_special"])


@pytest.mark.parametrize("template", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_each_real_template_has_a_dialect_that_matches_its_calls(template: Path) -> None:
    facts = facts_of(template)
    dialect = detect_dialect(template.read_text(), vocab_of(facts))
    assert dialect is not None and dialect.name != "none"
    rendered = facts["tool_call"]["assistant_turn_as_rendered"]
    if dialect.tool_call_start and dialect.leading_call is None:
        assert dialect.tool_call_start in rendered
    if dialect.tool_call_end:
        assert dialect.tool_call_end in rendered
    if dialect.leading_call:
        assert dialect.leading_call in rendered
    if dialect.channels:
        assert "<|channel|>" in rendered
    # The store's reading (`mlx models info`) agrees with the engine's.
    assert infer_tool_format(template.read_text(), dict.fromkeys(vocab_of(facts), 0)) == (
        dialect.name
    )


@pytest.mark.parametrize("template", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_think_markers_of_the_fixture_are_known(template: Path) -> None:
    """Where the family thinks in markers mlx-lm does not know, the dialect carries them."""
    facts = facts_of(template)
    markers = facts["think_markers"]
    dialect = detect_dialect(template.read_text(), vocab_of(facts))
    assert dialect is not None
    known_to_mlx_lm = {("<think>", "</think>"), ("<|channel>", "<channel|>")}
    if markers and tuple(markers) not in known_to_mlx_lm:
        assert (dialect.think_start, dialect.think_end) == tuple(markers)


def test_ids_in_mistral_templates_that_check_them() -> None:
    text = "{% if not tool_call.id is string or tool_call.id|length != 9 %}[CALL_ID]{% endif %}"
    dialect = detect_dialect("[TOOL_CALLS]" + text, set())
    assert dialect is not None and dialect.id_style == "alnum9"
    plain = detect_dialect("[TOOL_CALLS]{{ tool_call.name }}[ARGS]", set())
    assert plain is not None and plain.id_style == "any"


def test_no_markup_no_dialect() -> None:
    assert detect_dialect("{{ messages[0].content }}", {"<s>"}) is None
    assert detect_dialect(None, set()) is None


def test_vocabulary_alone_can_name_the_format() -> None:
    dialect = detect_dialect(None, {"<|tool_call_start|>", "<|tool_call_end|>"})
    assert dialect is not None and dialect.name == "pythonic"


def test_names_for_the_override_flag() -> None:
    assert dialect_named("harmony") is DIALECTS["harmony"]
    with pytest.raises(ValueError, match="known: "):
        dialect_named("nope")
