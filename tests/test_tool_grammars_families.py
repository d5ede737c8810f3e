"""Forced and strict tool calls for every family with a call grammar, on tiny models built from
the families' real chat templates (tests/fixtures/chat-templates) or, for families without one
there, the test templates of `mlxlaunch.testing.templates`.

What the template writes for a call is what a model of that family writes, so each family's
grammar must accept it token by token, refuse the same call with a wrong name or parameter,
and what it lets a random model sample must read back through the family's parser (mlx-lm's;
for the families whose readers are ours, a reader of the documented format written here)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import mlx_lm
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import (
    gemma4,
    glm47,
    json_tools,
    kimi_k2,
    longcat,
    minicpm5,
    minimax_m2,
    mistral,
    muse_spark,
    pythonic,
    qwen3_coder,
)
from test_constrain import allowed_ids, generate, prompt_tokens

from mlxlaunch.engine.decoding.grammar import GrammarConstraint
from mlxlaunch.engine.decoding.schema_refs import inline_refs
from mlxlaunch.engine.decoding.tool_grammar import supported_families, tool_call_constraint
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec
from mlxlaunch.store.dialects import DIALECTS, detect_dialect
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import TemplateFamily, real_template_family

pytestmark = pytest.mark.slow  # every test here builds or loads a model

FIXTURES = Path(__file__).parent / "fixtures" / "chat-templates"
CLAUDE_CODE = Path(__file__).parent / "fixtures" / "claude-code-2.1.332" / "print-mode-request.json"
USER = "Run the tool now."

Call = tuple[str, dict[str, Any]]  # (name, arguments) as a reader returns them
ParserTools = list[dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """One family as tested: the template its model uses, how its calls are cut out of a
    rendered conversation, and how they are read back."""

    family: str  # dialect name
    template: str  # fixture stem, or a test template's name
    start: str  # the text where the model's calls begin
    end: str  # the text after the calls (excluded) in the rendered turn
    read: Callable[[str, ParserTools], list[Call]]
    order: str = "schema"  # how arguments are ordered: "schema" or "required" first
    # How calls are written when the template's rendering is not this grammar's format.
    own_rendering: Callable[[list[Call]], str] | None = None
    parallel: bool = True  # a turn may hold several calls


def _calls(parsed: Any) -> list[Call]:
    items = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for item in items:
        arguments = item["arguments"]
        out.append(
            (item["name"], json.loads(arguments) if isinstance(arguments, str) else arguments)
        )
    return out


def _spans(text: str, start: str, end: str) -> list[str]:
    """The bodies between `start` and `end` markers; nothing but newlines outside them."""
    bodies = []
    rest = text
    while rest.strip("\n"):
        assert rest.lstrip("\n").startswith(start), f"not a call: {rest!r}"
        body, found, rest = rest.lstrip("\n")[len(start) :].partition(end)
        assert found, f"unclosed call: {text!r}"
        bodies.append(body)
    return bodies


def _each(
    start: str, end: str, parser: Callable[..., Any]
) -> Callable[[str, ParserTools], list[Call]]:
    def read(text: str, tools: ParserTools) -> list[Call]:
        return [c for body in _spans(text, start, end) for c in _calls(parser(body, tools))]

    return read


def _section(
    start: str, end: str, parser: Callable[..., Any]
) -> Callable[[str, ParserTools], list[Call]]:
    def read(text: str, tools: ParserTools) -> list[Call]:
        [body] = _spans(text, start, end)
        return _calls(parser(body, tools))

    return read


# Readers of the formats whose parsers are ours (engine/output): exactly the documented shape.
def read_mistral_with_ids(text: str, tools: ParserTools) -> list[Call]:
    calls, decoder, pos = [], json.JSONDecoder(), 0
    header = re.compile(r"\[TOOL_CALLS\]([\w-]+)\[CALL_ID\][A-Za-z0-9]{9}\[ARGS\]")
    while pos < len(text):
        match = header.match(text, pos)
        assert match, f"not a call at {text[pos:]!r}"
        arguments, pos = decoder.raw_decode(text, match.end())
        calls.append((match.group(1), arguments))
    return calls


def read_deepseek_v31(text: str, tools: ParserTools) -> list[Call]:
    begin, end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    assert text.startswith(begin) and text.endswith(end), text
    one = re.compile(r"<｜tool▁call▁begin｜>(.+?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
    body = text[len(begin) : -len(end)]
    assert "".join(m.group(0) for m in one.finditer(body)) == body, body
    return [(m.group(1), json.loads(m.group(2))) for m in one.finditer(body)]


def read_deepseek_v32(text: str, tools: ParserTools) -> list[Call]:
    begin, end = "<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>"
    assert text.startswith(begin) and text.endswith(end), text
    invoke = re.compile(r'<｜DSML｜invoke name="([^"]+)">\n(.*?)</｜DSML｜invoke>\n', re.DOTALL)
    param = re.compile(
        r'<｜DSML｜parameter name="([^"]+)" string="(true|false)">(.*?)</｜DSML｜parameter>\n',
        re.DOTALL,
    )
    body = text[len(begin) : -len(end)]
    assert "".join(m.group(0) for m in invoke.finditer(body)) == body, body
    calls = []
    for m in invoke.finditer(body):
        assert "".join(p.group(0) for p in param.finditer(m.group(2))) == m.group(2)
        arguments = {
            p.group(1): p.group(3) if p.group(2) == "true" else json.loads(p.group(3))
            for p in param.finditer(m.group(2))
        }
        calls.append((m.group(1), arguments))
    return calls


def read_llama3_json(text: str, tools: ParserTools) -> list[Call]:
    call = json.loads(text)
    assert list(call) == ["name", "parameters"], text
    return [(call["name"], call["parameters"])]


def _dsml_invoke(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(
        f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
        f"{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜parameter>\n"
        for k, v in arguments.items()
    )
    return f'<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>\n'


def _muse_invoke(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(
        f'<atem:parameter name="{k}">{json.dumps(v)}</atem:parameter>' for k, v in arguments.items()
    )
    return f'<atem:invoke name="{name}">{params}</atem:invoke>'


def dsml_calls(calls: list[Call]) -> str:
    """DeepSeek V3.2's DSML as its encoder writes it (no V3.2 template among the fixtures)."""
    invokes = "".join(_dsml_invoke(name, arguments) for name, arguments in calls)
    return f"<｜DSML｜function_calls>\n{invokes}</｜DSML｜function_calls>"


def muse_calls(calls: list[Call]) -> str:
    """Muse Spark's markup with every value in JSON, as the grammar writes it."""
    invokes = "".join(_muse_invoke(name, arguments) for name, arguments in calls)
    return f"<atem:function_calls>{invokes}</atem:function_calls>"


CASES = [
    Case("json_tools", "qwen3-0.6b", "<tool_call>", "<|im_end|>",
         _each("<tool_call>", "</tool_call>", lambda b, t: json_tools.parse_tool_call(b))),
    Case("qwen3_coder", "qwen3-coder", "<tool_call>", "<|im_end|>",
         _each("<tool_call>", "</tool_call>", qwen3_coder.parse_tool_call), order="required"),
    Case("glm47", "glm-4.6", "<tool_call>", "<|observation|>",
         _each("<tool_call>", "</tool_call>", glm47.parse_tool_call), order="required"),
    Case("minimax_m2", "minimax-m2", "<minimax:tool_call>", "[e~[",
         _section("<minimax:tool_call>", "</minimax:tool_call>", minimax_m2.parse_tool_call),
         order="required"),
    Case("kimi_k2", "kimi-k2-instruct-0905", "<|tool_calls_section_begin|>", "<|im_end|>",
         _section("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                  kimi_k2.parse_tool_call)),
    Case("mistral", "devstral-small-2507", "[TOOL_CALLS]", "</s>",
         lambda text, tools: _calls(mistral.parse_tool_call(text.removeprefix("[TOOL_CALLS]")))),
    Case("mistral", "mistral-small-3.2", "[TOOL_CALLS]", "</s>", read_mistral_with_ids),
    Case("deepseek_v31", "deepseek-v3.1", "<｜tool▁calls▁begin｜>", "<｜end▁of▁sentence｜>",
         read_deepseek_v31),
    # No DeepSeek V3.2 template among the fixtures: V3.1's tokenizer, our own rendering.
    Case("deepseek_v32", "deepseek-v3.1", "<｜DSML｜function_calls>", "<｜end▁of▁sentence｜>",
         read_deepseek_v32, order="required", own_rendering=dsml_calls),
    Case("llama3_json", "llama-3.3-70b", "{", "<|eot_id|>", read_llama3_json, parallel=False),
    Case("gemma4", "gemma-4-31b", "<|tool_call>", "<|tool_response>",
         _each("<|tool_call>", "<tool_call|>", lambda b, t: gemma4.parse_tool_call(b))),
    # Families with test templates only (mlxlaunch/testing/templates).
    Case("pythonic", "pythonic", "<|tool_call_start|>", "<|im_end|>",
         _section("<|tool_call_start|>", "<|tool_call_end|>", pythonic.parse_tool_call),
         order="required", parallel=False),  # the test template opens a section per call
    Case("longcat", "longcat", "<longcat_tool_call>", "<|im_end|>",
         _each("<longcat_tool_call>", "</longcat_tool_call>", longcat.parse_tool_call),
         order="required"),
    Case("minicpm5", "minicpm5", '<function name="', "<|im_end|>",
         lambda text, tools: _calls(minicpm5.parse_tool_call(text, tools)), order="required"),
    # The test template writes strings raw; the grammar writes every value as JSON.
    Case("muse_spark", "muse_spark", "<atem:function_calls>", "<|im_end|>",
         _section("<atem:function_calls>", "</atem:function_calls>", muse_spark.parse_tool_call),
         order="required", own_rendering=muse_calls),
]  # fmt: skip
CASE_IDS = [f"{c.family}-{c.template}" for c in CASES]

BASH = ToolSpec(
    "Bash",
    "Run a command.",
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "command": {"type": "string", "maxLength": 12},
            "description": {"type": "string", "maxLength": 12},
            "timeout": {"type": "integer", "minimum": 0, "maximum": 600000},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)
WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city.",
    {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
TOOLS = [BASH, WEATHER]


@dataclass
class Loaded:
    model: Any
    tokenizer: TokenizerWrapper


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Loaded]]:
    """A loader of tiny models by template, each built once for the module."""
    cache: dict[str, Loaded] = {}

    def load(template: str) -> Loaded:
        if template not in cache:
            family: TemplateFamily | str = template
            if (FIXTURES / f"{template}.jinja").exists():
                family = real_template_family(FIXTURES / f"{template}.jinja")
            path = build_model(tmp_path_factory.mktemp(template), "tiny", template=family)
            model, tokenizer = mlx_lm.load(str(path))[:2]
            cache[template] = Loaded(model, tokenizer)
        return cache[template]

    yield load


def parser_tools(tools: list[ToolSpec]) -> ParserTools:
    return [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in tools
    ]


def arranged(case: Case, tool: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments in the order the family's grammar writes them (templates keep dict order;
    Gemma's sorts keys itself)."""
    props = list(tool.parameters.get("properties", {}))
    required = [p for p in tool.parameters.get("required", []) if p in props]
    order = props if case.order == "schema" else required + [p for p in props if p not in required]
    return {k: arguments[k] for k in order if k in arguments}


def rendered_calls(case: Case, tokenizer: TokenizerWrapper, calls: list[Call]) -> str:
    """What a model of this family writes for these calls: its template's rendering of them,
    or the case's own."""
    if case.own_rendering is not None:
        return case.own_rendering(calls)
    tool_calls = [
        {
            "id": "a1b2c3d4e" if case.template == "mistral-small-3.2" else f"functions.{name}:{i}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        for i, (name, arguments) in enumerate(calls)
    ]
    messages = [
        {"role": "user", "content": USER},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
    ]
    text = str(tokenizer.apply_chat_template(messages, tokenize=False))
    begin = text.index(case.start, text.index(USER))
    end = text.find(case.end, begin)
    return text[begin : end if end >= 0 else None].rstrip("\n")


def follows(constraint: GrammarConstraint, tokenizer: TokenizerWrapper, text: str) -> bool:
    """Whether the grammar allows every token of `text` (as the tokenizer splits it) and may
    end after it."""
    prompt = prompt_tokens(tokenizer, USER)
    processor = constraint.logits_processor()
    vocab = len(tokenizer.vocab)
    sequence = prompt + tokenizer.encode(text, add_special_tokens=False)
    allowed = allowed_ids(processor, prompt, vocab)
    for n in range(len(prompt), len(sequence)):
        if sequence[n] not in allowed:
            return False
        allowed = allowed_ids(processor, sequence[: n + 1], vocab)
    return bool(allowed & set(tokenizer.eos_token_ids))


def forced(
    tokenizer: TokenizerWrapper, case: Case, tools: list[ToolSpec], **kw: Any
) -> GrammarConstraint:
    choice = ToolChoice("any", parallel=kw.pop("parallel", False))
    dialect = detect_dialect(tokenizer.chat_template, tokenizer.vocab)
    if dialect is None or dialect.name != case.family:
        dialect = DIALECTS[case.family]
    constraint = tool_call_constraint(
        tokenizer, tools, choice, family=case.family, dialect=dialect, **kw
    )
    assert constraint is not None
    return constraint


# --- the template's own calls -----------------------------------------------------------------

BASH_CALL = {"command": "ls -la src", "description": "List files", "timeout": 5000,
             "run_in_background": True}  # fmt: skip
WEATHER_CALL = {"unit": "c", "city": "Oslo", "days": 3}


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_the_families_own_call_is_accepted_and_reads_back(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    arguments = arranged(case, BASH, BASH_CALL)
    text = rendered_calls(case, tokenizer, [("Bash", arguments)])
    assert follows(forced(tokenizer, case, TOOLS), tokenizer, text), text
    assert case.read(text, parser_tools(TOOLS)) == [("Bash", arguments)]


@pytest.mark.parametrize("case", [c for c in CASES if c.parallel], ids=lambda c: c.family)
def test_parallel_calls_are_accepted_as_the_family_writes_them(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    calls = [
        ("Bash", arranged(case, BASH, {"command": "pwd"})),
        ("get_weather", arranged(case, WEATHER, WEATHER_CALL)),
    ]
    text = rendered_calls(case, tokenizer, calls)
    assert follows(forced(tokenizer, case, TOOLS, parallel=True), tokenizer, text), text
    assert case.read(text, parser_tools(TOOLS)) == calls
    # With parallel calls off, the same two calls are one too many.
    assert not follows(forced(tokenizer, case, TOOLS), tokenizer, text)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_wrong_name_parameter_or_value_is_refused(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    constraint = forced(tokenizer, case, TOOLS)
    good = rendered_calls(case, tokenizer, [("get_weather", arranged(case, WEATHER, WEATHER_CALL))])
    assert follows(constraint, tokenizer, good), good
    wrong_name = good.replace("get_weather", "get_wether")
    wrong_key = good.replace("city", "town")
    too_long = good.replace("Oslo", "Oslo-and-further")  # maxLength 10
    out_of_range = good.replace("3", "9")  # days <= 7
    for bad in (wrong_name, wrong_key, too_long, out_of_range, "Sure, here it is."):
        assert bad != good
        assert not follows(constraint, tokenizer, bad), bad


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_auto_with_a_strict_tool_allows_text_or_a_valid_call(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    strict = ToolSpec(WEATHER.name, WEATHER.description, WEATHER.parameters, strict=True)
    dialect = DIALECTS[case.family]
    constraint = tool_call_constraint(
        tokenizer, [strict, BASH], ToolChoice("auto"), dialect=dialect
    )
    assert constraint is not None
    good = rendered_calls(case, tokenizer, [("get_weather", arranged(case, WEATHER, WEATHER_CALL))])
    prose = "Let me check. " if case.family != "llama3_json" else ""  # Llama: call or text
    assert follows(constraint, tokenizer, prose + good), good
    assert follows(constraint, tokenizer, "No call needed.")
    assert not follows(constraint, tokenizer, prose + good.replace("city", "town"))
    # Bash is not strict: any arguments pass, as long as it is a call in the family's markup.
    loose = rendered_calls(case, tokenizer, [("Bash", {"whatever": "x"})])
    assert follows(constraint, tokenizer, prose + loose), loose


# --- sampled calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sampled_forced_calls_read_back_valid(models: Callable[[str], Loaded], case: Case) -> None:
    """A random model writes only what the grammar allows: every output is one complete call of
    an offered tool, and its parser reads arguments that match the schema."""
    loaded = models(case.template)
    constraint = forced(loaded.tokenizer, case, TOOLS)
    processors = [constraint.logits_processor() for _ in range(6)]
    results = generate(loaded.model, loaded.tokenizer, processors, max_tokens=160, seed=3)
    schemas = {t.name: {k: v for k, v in t.parameters.items() if k != "$schema"} for t in TOOLS}
    for (tokens, reason), processor in zip(results, processors, strict=True):
        text = loaded.tokenizer.decode(tokens)
        assert reason == "stop" and processor.complete, f"cut or broken: {text!r}"
        [(name, arguments)] = case.read(text, parser_tools(TOOLS))
        jsonschema.validate(arguments, schemas[name])


# --- Claude Code's tools -----------------------------------------------------------------------


def claude_code_tools() -> list[ToolSpec]:
    body = json.loads(CLAUDE_CODE.read_text("utf-8"))["body"]
    return [ToolSpec(t["name"], t.get("description", ""), t["input_schema"]) for t in body["tools"]]


# One call per shape of argument the tools take: strings, numbers, booleans, enums, an array of
# objects with enums and bounded strings.
CLAUDE_CODE_CALLS: list[Call] = [
    ("Read", {"file_path": "/src/a.py", "offset": 10, "limit": 5}),
    ("Edit", {"file_path": "a.py", "old_string": "x = 1", "new_string": "x = 2",
              "replace_all": False}),
    ("Agent", {"description": "Find uses", "prompt": "Look for x", "model": "haiku"}),
    ("ReportFindings", {"level": "low", "findings": [
        {"file": "a.py", "line": 3, "summary": "bug", "failure_scenario": "crash",
         "severity": "nit"}]}),
    ("ToolSearch", {"query": "select:Read", "max_results": 3}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_claude_code_tools_compile_and_their_calls_are_accepted(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    tools = claude_code_tools()
    constraint = forced(tokenizer, case, tools)
    by_name = {t.name: t for t in tools}
    for name, arguments in CLAUDE_CODE_CALLS:
        ordered = arranged(case, by_name[name], arguments)
        text = rendered_calls(case, tokenizer, [(name, ordered)])
        assert follows(constraint, tokenizer, text), text
        [(read_name, read_arguments)] = case.read(text, parser_tools(tools))
        assert read_name == name
        jsonschema.validate(read_arguments, by_name[name].parameters)


# --- schemas with references -------------------------------------------------------------------

NODE_TOOL = ToolSpec(
    "Plan",
    "Plan steps.",
    {
        "type": "object",
        "$defs": {
            "Step": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 8},
                    "after": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "maxItems": 2},
                },
                "required": ["title"],
                "additionalProperties": False,
            },
            "Kind": {"enum": ["quick", "deep"]},
        },
        "properties": {
            "kind": {"$ref": "#/$defs/Kind"},
            "step": {"$ref": "#/$defs/Step"},
        },
        "required": ["kind", "step"],
        "additionalProperties": False,
    },
)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_refs_are_followed_and_recursion_is_cut_to_any_value(
    models: Callable[[str], Loaded], case: Case
) -> None:
    tokenizer = models(case.template).tokenizer
    constraint = forced(tokenizer, case, [NODE_TOOL])
    nested = {"title": "a", "after": [{"title": "b", "after": [{"title": "c", "x": 1}]}]}
    good = rendered_calls(case, tokenizer, [("Plan", {"kind": "quick", "step": nested})])
    assert follows(constraint, tokenizer, good), good
    bad_kind = rendered_calls(case, tokenizer, [("Plan", {"kind": "slow", "step": nested})])
    assert not follows(constraint, tokenizer, bad_kind)
    bad_step = rendered_calls(case, tokenizer, [("Plan", {"kind": "deep", "step": {"title": 5}})])
    assert not follows(constraint, tokenizer, bad_step)


def test_every_dialect_but_function_gemma_and_harmony_has_a_call_grammar() -> None:
    readers = {d.name for d in DIALECTS.values() if d.name != "harmony"} - {"function_gemma"}
    assert readers <= set(supported_families())
    assert "function_gemma" not in supported_families()


def test_a_family_without_a_grammar_is_refused(models: Callable[[str], Loaded]) -> None:
    tokenizer = models("qwen3-0.6b").tokenizer
    with pytest.raises(InvalidRequest, match="cannot force tool calls for this model's tool-call"):
        tool_call_constraint(tokenizer, TOOLS, ToolChoice("any"), family="function_gemma")


@pytest.mark.parametrize(
    "ref", ["#/$defs/Nope", "https://example.com/schema.json", "#anchor", "#/properties/x/9"]
)
def test_a_reference_that_cannot_be_followed_is_an_invalid_request(
    models: Callable[[str], Loaded], ref: str
) -> None:
    tokenizer = models("qwen3-0.6b").tokenizer
    schema = {"type": "object", "properties": {"x": {"$ref": ref}}, "$defs": {}}
    with pytest.raises(InvalidRequest, match="cannot resolve \\$ref"):
        tool_call_constraint(
            tokenizer, [ToolSpec("T", "", schema)], ToolChoice("any"), family="glm47"
        )


@pytest.mark.parametrize("step", ["\u00b2", "7" * 5000, "-1"], ids=["superscript", "huge", "sign"])
def test_an_array_step_int_refuses_points_nowhere(step: str) -> None:
    """`isdigit` takes "²" and int() refuses it (and 5,000 digits): a 500 before (issue 35)."""
    schema = {"properties": {"x": {"$ref": f"#/$defs/a/{step}"}}, "$defs": {"a": [{}]}}
    with pytest.raises(InvalidRequest, match="points nowhere"):
        inline_refs(schema)


def test_refs_inline_with_their_siblings_and_escaped_pointers() -> None:
    schema = {
        "definitions": {"a/b": {"type": "string"}, "n": {"type": "integer"}},
        "properties": {
            "s": {"$ref": "#/definitions/a~1b", "description": "dropped", "maxLength": 3},
            "n": {"$ref": "#/definitions/n", "type": "number"},  # overlaps: kept apart
            "$ref": {"type": "boolean"},  # a property named "$ref" is a property
        },
    }
    assert inline_refs(schema) == {
        "properties": {
            "s": {"type": "string", "maxLength": 3},
            "n": {"allOf": [{"type": "integer"}, {"type": "number"}]},
            "$ref": {"type": "boolean"},
        },
    }
    assert inline_refs({"type": "string"}) == {"type": "string"}  # nothing to do: unchanged
