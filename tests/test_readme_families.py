"""The README's family table says what the code does, for every fixture template."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlxlaunch.engine.decoding.tool_grammar import supported_families
from mlxlaunch.engine.output.json_readers import json_span_reader
from mlxlaunch.engine.output.param_readers import param_span_reader
from mlxlaunch.store.dialects import detect_dialect

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "tests" / "fixtures" / "chat-templates").glob("*.jinja"))


def table_rows() -> dict[str, list[str]]:
    """Fixture name -> the row's cells, from the README's family table."""
    rows: dict[str, list[str]] = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        found = re.match(r"\| [^|]*\(`([^`]+)`\) \|(.*)\|$", line)
        if found:
            rows[found.group(1)] = [c.strip() for c in found.group(2).split("|")]
    return rows


def test_every_fixture_has_a_row() -> None:
    assert set(table_rows()) == {p.stem for p in TEMPLATES}


@pytest.mark.parametrize("template", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_the_row_matches_the_code(template: Path) -> None:
    facts = json.loads(template.with_suffix(".tokens.json").read_text())
    vocab = set(facts["special_tokens"]) | set(facts["added_tokens_not_special"])
    dialect = detect_dialect(template.read_text(), vocab)
    assert dialect is not None
    fmt, calls, thinking, forced, streamed = table_rows()[template.stem]
    assert fmt == f"`{dialect.name}`"
    assert calls == "yes"
    thinks = bool(facts["think_markers"]) or dialect.channels
    assert (thinking != "—") == thinks
    enforced = dialect.name in supported_families() or dialect.channels
    assert (forced == "yes") == enforced
    if dialect.arguments == "json" and (json_span_reader(dialect.name) or dialect.channels):
        assert streamed == "as written"
    elif dialect.arguments == "params" and param_span_reader(dialect.name, []):
        assert streamed == "each parameter"
    else:
        assert streamed == "whole, at its end"
