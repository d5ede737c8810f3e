"""A freeform tool's grammar (Codex's `apply_patch` Lark grammar) inside every family's call
markup: a JSON envelope writes the patch JSON-string-escaped, a parameter-element family raw;
what the family's template writes for a valid patch is accepted and reads back as that patch,
a broken patch is refused, and what a random model samples under the grammar is a complete
call whose input parses as a patch (checked by llguidance on Codex's own grammar and by a
reader of the patch format written here)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import llguidance
import llguidance.hf
import pytest
from test_constrain import generate
from test_tool_grammars_families import (
    CASES,
    Case,
    Loaded,
    follows,
    forced,
    models,
    parser_tools,
    rendered_calls,
)

from mlxlaunch.engine.decoding.input_grammar import check_input_grammar, input_rules
from mlxlaunch.engine.runtime.mlx_lm_internals import hf_tokenizer_of
from mlxlaunch.engine.types import InputGrammar, InvalidRequest, ToolSpec
from mlxlaunch.server.call_arguments import freeform_tool

__all__ = ["models"]  # the fixture, used by name

FIXTURES = Path(__file__).parent / "fixtures"
CODEX_LARK = (FIXTURES / "apply_patch.lark").read_text()
FIELD = "tools[0].format.definition"
# Codex's grammar with bounded terminals and counts (a sublanguage of it), so that a random
# model's sample ends within a few hundred tokens; the classes hold what JSON must escape.
BOUNDED_LARK = r"""
start: begin_patch hunk end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line~1..2
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change
filename: /[a-z"\\]{1,6}\.py/
add_line: "+" /[ -~\t]{0,8}/ LF -> line
change: (change_context | change_line)~1..2
change_context: "@@" LF
change_line: ("+" | "-" | " ") /[^\n]{0,6}/ LF
%import common.LF
"""
PATCH = (
    "*** Begin Patch\n"
    "*** Update File: src/a b.py\n"
    "@@ def greet():\n"
    '-    print("hi")\n'
    '+    print("hi \\"you\\"\\n")\t# tab\n'
    " \n"
    "*** Add File: notes.txt\n"
    "+C:\\path\\to\n"
    "*** Delete File: old.py\n"
    "*** End Patch\n"
)
# The families whose markup a freeform tool's grammar goes into (Gemma's notation and
# Harmony's channels take the input as their string schema says).
GRAMMAR_CASES = [c for c in CASES if c.family != "gemma4"]


def patch_hunks(text: str) -> list[tuple[str, str]]:
    """Read an apply_patch patch as Codex's format documents it: (kind, path) per hunk.

    Raises:
        ValueError: the text is not a patch.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 3 or lines[0] != "*** Begin Patch" or lines[-1] != "*** End Patch":
        raise ValueError("no Begin Patch / End Patch around the hunks")
    hunks: list[tuple[str, str]] = []
    body = lines[1:-1]
    at = 0
    while at < len(body):
        line = body[at]
        kind, _, path = line.partition(": ")
        if kind not in ("*** Add File", "*** Delete File", "*** Update File") or not path:
            raise ValueError(f"not a hunk header: {line!r}")
        hunks.append((kind.removeprefix("*** ").split()[0], path))
        at += 1
        if kind == "*** Update File" and at < len(body) and body[at].startswith("*** Move to: "):
            at += 1
        count = 0
        while (at < len(body) and not body[at].startswith("*** ")) or (
            at < len(body) and body[at] == "*** End of File"
        ):
            line = body[at]
            if kind == "*** Add File" and not line.startswith("+"):
                raise ValueError(f"an added file's line without '+': {line!r}")
            if kind == "*** Update File" and not ((line[:1] in "+- " and line) or line[:2] == "@@"):
                raise ValueError(f"not a change line: {line!r}")
            if kind == "*** Delete File":
                raise ValueError("a deleted file has no lines")
            at += 1
            count += 1
        if kind == "*** Add File" and not count:
            raise ValueError("an added file needs lines")
    if not hunks:
        raise ValueError("a patch needs a hunk")
    return hunks


def apply_patch_tool(definition: str = CODEX_LARK) -> ToolSpec:
    grammar = InputGrammar("lark", definition, FIELD)
    return freeform_tool("apply_patch", "Edit files.", grammar)


def codex_accepts(loaded: Loaded, text: str) -> bool:
    """Whether Codex's own grammar, as llguidance reads it, takes `text` whole."""
    llg = llguidance.hf.from_tokenizer(hf_tokenizer_of(loaded.tokenizer))
    matcher = llguidance.LLMatcher(llg, llguidance.grammar_from("lark", CODEX_LARK))
    tokens = llg.tokenize_str(text)
    return matcher.validate_tokens(tokens) == len(tokens) and (
        matcher.consume_tokens(tokens) and matcher.is_accepting()
    )


def test_the_patch_reader_knows_a_patch() -> None:
    assert patch_hunks(PATCH) == [
        ("Update", "src/a b.py"),
        ("Add", "notes.txt"),
        ("Delete", "old.py"),
    ]
    for bad in ("", "*** Begin Patch\n*** End Patch\n", PATCH.replace("+C:", "C:")):
        with pytest.raises(ValueError):
            patch_hunks(bad)


def test_the_rewritten_grammar_escapes_what_json_escapes() -> None:
    rules = input_rules(InputGrammar("regex", r'a"\\b\n.', FIELD), "g", escaped=True)
    assert '"a\\\\\\"\\\\\\\\b\\\\n"' in rules.text  # a, \", \\, b, \n as one literal
    raw = input_rules(InputGrammar("regex", r'a"\\b\n.', FIELD), "g", escaped=False)
    assert '"a\\"\\\\b\\n"' in raw.text


@pytest.mark.parametrize(
    ("definition", "reason"),
    [
        ("start: foo", "'foo' is used but never defined"),
        ('rule: "a"', "no `start` rule"),
        ('start: "a"\n%ignore " "', "%ignore"),
        ("start: /(a)\\1/", "backreferences"),
        ("start: /(?=a)a/", "look-ahead"),
        ("start: /a{20000}/", "repeats too much"),
        ('start: "a" ~ 50000', "repeats too much"),
        ("start: /[/", "regex"),
        ("start: %json {}", "%json"),
        ('start: "a" @x', "cannot read the grammar"),
        ("%import common.NOPE\nstart: NOPE", "common.NOPE"),
        ('start: ("a" | "b"', "does not compile"),
    ],
)
def test_a_broken_grammar_is_refused_naming_its_field(definition: str, reason: str) -> None:
    with pytest.raises(InvalidRequest, match=FIELD.replace("[", r"\[").replace("]", r"\]")) as exc:
        check_input_grammar(InputGrammar("lark", definition, FIELD))
    assert reason in str(exc.value)


def test_a_grammar_too_large_is_refused_before_it_is_read() -> None:
    """llguidance's compile grows faster than a grammar's size (80,000 literal alternatives:
    28 s), so the bound is on the text, checked first: refused at once."""
    huge = "start: " + " | ".join(f'"{i}"' for i in range(200_000))
    started = time.perf_counter()
    with pytest.raises(InvalidRequest, match="more than 64 KiB"):
        check_input_grammar(InputGrammar("lark", huge, FIELD))
    assert time.perf_counter() - started < 0.5
    classes = "start: " + " | ".join(f"/[{chr(0x4E00 + i)}x]/" for i in range(1_500))
    with pytest.raises(InvalidRequest, match="1000 distinct character classes"):
        check_input_grammar(InputGrammar("lark", classes, FIELD))


def test_codex_grammar_compiles() -> None:
    check_input_grammar(InputGrammar("lark", CODEX_LARK, FIELD))
    check_input_grammar(InputGrammar("regex", r"^\d{3}-[a-z]+$", FIELD))


# --- in the families' markup ------------------------------------------------------------


def _read_input(case: Case, text: str, tool: ToolSpec) -> str:
    [(name, arguments)] = case.read(text, parser_tools([tool]))
    assert name == "apply_patch"
    value = arguments["input"]
    assert isinstance(value, str)
    return value


@pytest.mark.slow
@pytest.mark.parametrize("case", GRAMMAR_CASES, ids=lambda c: f"{c.family}-{c.template}")
def test_a_valid_patch_is_accepted_and_reads_back(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    tool = apply_patch_tool()
    constraint = forced(tokenizer, case, [tool])
    text = rendered_calls(case, tokenizer, [("apply_patch", {"input": PATCH})])
    assert follows(constraint, tokenizer, text), text
    # Raw-text families' readers strip the value's edges: the patch's last newline.
    assert _read_input(case, text, tool).rstrip("\n") == PATCH.rstrip("\n")
    for broken in (PATCH.replace("*** Begin Patch\n", ""), PATCH.replace("+C:", "C:")):
        bad = rendered_calls(case, tokenizer, [("apply_patch", {"input": broken})])
        assert not follows(constraint, tokenizer, bad), bad


@pytest.mark.slow
@pytest.mark.parametrize("case", GRAMMAR_CASES, ids=lambda c: f"{c.family}-{c.template}")
def test_sampled_patches_parse(models: Callable[[str], Loaded], case: Case) -> None:
    """A random model, forced to call the tool, writes a complete call whose input is a patch
    under Codex's grammar (a bounded sublanguage of it, so that samples end)."""
    loaded = models(case.template)
    tool = apply_patch_tool(BOUNDED_LARK)
    constraint = forced(loaded.tokenizer, case, [tool])
    processors = [constraint.logits_processor() for _ in range(4)]
    results = generate(loaded.model, loaded.tokenizer, processors, max_tokens=400, seed=5)
    for (tokens, reason), processor in zip(results, processors, strict=True):
        text = loaded.tokenizer.decode(tokens)
        assert reason == "stop" and processor.complete, f"cut or broken: {text!r}"
        patch = _read_input(case, text, tool)
        assert patch_hunks(patch), patch
        assert codex_accepts(loaded, patch), patch
        if case.family == "json_tools":  # the envelope holds the patch JSON-escaped
            assert json.dumps(patch, ensure_ascii=False)[1:-1] in text
