"""Tool-call constraints: forced calls come out in the family's markup, parse with mlx-lm's own
parser for that family, name an offered tool and carry arguments valid for its schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mlx_lm
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import json_tools, qwen3_coder
from test_constrain import allowed_ids, generate, prompt_tokens

from mlxlaunch.engine.decoding.grammar import GrammarConstraint, llg_tokenizer
from mlxlaunch.engine.decoding.tool_grammar import supported_families, tool_call_constraint
from mlxlaunch.engine.types import InvalidRequest, ToolChoice, ToolSpec
from mlxlaunch.testing import ensure_test_model

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
BASH = ToolSpec(
    "Bash",
    "Run a command.",
    {  # the shape Claude Code sends, $schema included
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "command": {"type": "string", "maxLength": 12},
            "timeout": {"type": "integer", "minimum": 0, "maximum": 600000},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)
TOOLS = [WEATHER, BASH]
SCHEMAS = {t.name: {k: v for k, v in t.parameters.items() if k != "$schema"} for t in TOOLS}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, TokenizerWrapper]:
    loaded = mlx_lm.load(str(ensure_test_model("tiny")))
    return loaded[0], loaded[1]


def constrained_outputs(
    tiny: tuple[Any, TokenizerWrapper],
    constraint: GrammarConstraint,
    n: int,
    max_tokens: int,
    allow_cut: bool = False,
) -> list[str]:
    """`n` sampled outputs; a cut by max_tokens fails the test unless `allow_cut`."""
    model, tokenizer = tiny
    processors = [constraint.logits_processor() for _ in range(n)]
    results = generate(model, tokenizer, processors, max_tokens=max_tokens, seed=1)
    texts = []
    for (tokens, reason), processor in zip(results, processors, strict=True):
        text = tokenizer.decode(tokens)
        assert processor.error is None
        if reason != "length" or not allow_cut:
            assert reason == "stop", f"cut at max_tokens: {text!r}"
            assert processor.complete
        texts.append(text)
    return texts


def json_tools_calls(text: str) -> list[dict[str, Any]]:
    """Split the output into <tool_call> spans and parse each as mlx-lm does."""
    spans = text.split("<tool_call>")
    assert spans[0] == "", f"text before the first call: {text!r}"
    calls = []
    for span in spans[1:]:
        body, rest = span.split("</tool_call>")
        assert rest in ("", "\n")
        calls.append(json_tools.parse_tool_call(body))
    return calls


def check_call(call: dict[str, Any], names: set[str]) -> None:
    assert call["name"] in names
    jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])


def test_tool_choice_any_always_yields_one_valid_call(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    constraint = tool_call_constraint(
        tokenizer, TOOLS, ToolChoice("any", parallel=False), family="json_tools"
    )
    assert constraint is not None
    names = []
    for text in constrained_outputs(tiny, constraint, n=12, max_tokens=90):
        [call] = json_tools_calls(text)
        check_call(call, {"get_weather", "Bash"})
        names.append(call["name"])
    assert len(set(names)) == 2  # the model chooses; the grammar does not pick for it


def test_parallel_calls_are_each_valid(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    constraint = tool_call_constraint(tokenizer, TOOLS, ToolChoice("any"), family="json_tools")
    assert constraint is not None
    # A random model may chain calls until max_tokens; every complete call must be valid.
    for text in constrained_outputs(tiny, constraint, n=6, max_tokens=150, allow_cut=True):
        complete = text[: text.rfind("</tool_call>") + len("</tool_call>")]
        calls = json_tools_calls(complete)
        assert calls
        for call in calls:
            check_call(call, {"get_weather", "Bash"})


def test_a_named_tool_is_the_only_one_called(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    choice = ToolChoice("tool", name="Bash", parallel=False)
    constraint = tool_call_constraint(tokenizer, TOOLS, choice, family="json_tools")
    assert constraint is not None
    for text in constrained_outputs(tiny, constraint, n=6, max_tokens=60):
        [call] = json_tools_calls(text)
        check_call(call, {"Bash"})


def test_the_markers_are_the_single_markup_tokens(tiny: tuple[Any, Any]) -> None:
    """mlx-lm finds tool calls by the marker's token ids, so the marker must not be spelled."""
    model, tokenizer = tiny
    constraint = tool_call_constraint(
        tokenizer, [WEATHER], ToolChoice("any", parallel=False), family="json_tools"
    )
    assert constraint is not None
    processor = constraint.logits_processor()
    assert allowed_ids(processor, prompt_tokens(tokenizer), model.args.vocab_size) == set(
        tokenizer.encode("<tool_call>", add_special_tokens=False)
    )


def test_qwen3_coder_calls_parse_with_its_parser(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    constraint = tool_call_constraint(
        tokenizer, TOOLS, ToolChoice("any", parallel=False), family="qwen3_coder"
    )
    assert constraint is not None
    openai_tools = [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in TOOLS
    ]
    for text in constrained_outputs(tiny, constraint, n=8, max_tokens=90):
        assert text.startswith("<tool_call>\n") and text.endswith("</tool_call>")
        body = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
        call = qwen3_coder.parse_tool_call(body, openai_tools)
        assert call["name"] in ("get_weather", "Bash")
        arguments = call["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        # Raw string values lose surrounding newlines in the parser; check everything else.
        props = SCHEMAS[call["name"]]["properties"]
        assert set(arguments) <= set(props)
        for key, value in arguments.items():
            if props[key].get("type") != "string":
                jsonschema.validate(value, props[key])


def test_auto_with_a_strict_tool_allows_text_or_a_valid_call(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    strict = ToolSpec(WEATHER.name, WEATHER.description, WEATHER.parameters, strict=True)
    constraint = tool_call_constraint(
        tokenizer, [strict, BASH], ToolChoice("auto"), family="json_tools"
    )
    assert constraint is not None
    vocab = model.args.vocab_size
    prompt = prompt_tokens(tokenizer)
    good = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    bad = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>'
    assert follows(constraint, tokenizer, prompt, good, vocab)
    assert not follows(constraint, tokenizer, prompt, bad, vocab)
    # Bash is not strict: any JSON object passes as its arguments.
    loose = '<tool_call>\n{"name": "Bash", "arguments": {"x": [1, 2]}}\n</tool_call>'
    assert follows(constraint, tokenizer, prompt, loose, vocab)
    assert follows(constraint, tokenizer, prompt, "Just text, no call.", vocab)


def test_a_think_span_may_close_before_a_forced_call(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    constraint = tool_call_constraint(
        tokenizer, [BASH], ToolChoice("any"), family="json_tools", think_end="</think>"
    )
    assert constraint is not None
    prompt = prompt_tokens(tokenizer)
    call = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assert follows(
        constraint, tokenizer, prompt, "Let me list.\n</think>\n\n" + call, model.args.vocab_size
    )
    assert not follows(constraint, tokenizer, prompt, call, model.args.vocab_size)


def follows(
    constraint: GrammarConstraint,
    tokenizer: TokenizerWrapper,
    prompt: list[int],
    text: str,
    vocab: int,
) -> bool:
    """Whether the grammar allows every token of `text` and may end after it."""
    processor = constraint.logits_processor()
    sequence = prompt + tokenizer.encode(text, add_special_tokens=False)
    allowed = allowed_ids(processor, prompt, vocab)
    for n in range(len(prompt), len(sequence)):
        if sequence[n] not in allowed:
            return False
        allowed = allowed_ids(processor, sequence[: n + 1], vocab)
    return bool(allowed & set(tokenizer.eos_token_ids))


def test_no_constraint_when_nothing_is_forced(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    for choice in (ToolChoice("auto"), ToolChoice("none")):
        assert tool_call_constraint(tokenizer, TOOLS, choice, family="json_tools") is None


@pytest.mark.parametrize(
    ("tools", "choice", "family", "message"),
    [
        (TOOLS, ToolChoice("tool", name="Nope"), "json_tools", "not offered"),
        ([], ToolChoice("any"), "json_tools", "at least one tool"),
        (TOOLS, ToolChoice("any"), "function_gemma", "cannot force tool calls.*supported: "),
    ],
)
def test_impossible_tool_choices_are_invalid_requests(
    tiny: tuple[Any, Any], tools: list[ToolSpec], choice: ToolChoice, family: str, message: str
) -> None:
    _, tokenizer = tiny
    with pytest.raises(InvalidRequest, match=message):
        tool_call_constraint(tokenizer, tools, choice, family=family)


def test_supported_families() -> None:
    families = supported_families()
    assert {"json_tools", "qwen3_coder", "glm47", "minimax_m2", "kimi_k2", "mistral"} <= set(
        families
    )
    assert {"deepseek_v31", "deepseek_v32", "llama3_json", "gemma4"} <= set(families)
    assert "function_gemma" not in families
    assert families == sorted(families)


def test_a_raw_string_parameter_ends_before_its_length_limit(tiny: tuple[Any, Any]) -> None:
    """Raw text followed by a spelled closer is one lazy lexeme: a greedy text lexeme would
    swallow "\n</parameter" and could end only at maxLength (or, unbounded, never)."""
    model, tokenizer = tiny
    unbounded = ToolSpec(
        "Bash", "", {"type": "object", "properties": {"command": {"type": "string"}}}
    )
    for tool in (BASH, unbounded):
        constraint = tool_call_constraint(
            tokenizer, [tool], ToolChoice("any", parallel=False), family="qwen3_coder"
        )
        assert constraint is not None
        call = (
            "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n"
            "</function>\n</tool_call>"
        )
        assert follows(constraint, tokenizer, prompt_tokens(tokenizer), call, model.args.vocab_size)


def test_claude_code_tool_schemas_compile(tiny: tuple[Any, Any]) -> None:
    """Every tool of a captured Claude Code request compiles into a forced-call grammar."""
    _, tokenizer = tiny
    path = "tests/fixtures/claude-code-2.1.332/print-mode-request.json"
    with open(path, encoding="utf-8") as fh:
        body = json.load(fh)["body"]
    tools = [
        ToolSpec(t["name"], t.get("description", ""), t["input_schema"]) for t in body["tools"]
    ]
    constraint = tool_call_constraint(tokenizer, tools, ToolChoice("any"), family="json_tools")
    assert constraint is not None
    processor = constraint.logits_processor()
    allowed = allowed_ids(processor, prompt_tokens(tokenizer), llg_tokenizer(tokenizer).vocab_size)
    assert allowed == set(tokenizer.encode("<tool_call>", add_special_tokens=False))
