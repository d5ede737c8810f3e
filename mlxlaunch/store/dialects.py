"""Model dialects: how a family writes tool calls and thinking, read from its tokenizer files.

A dialect is found from the chat template's markup and the tokenizer's vocabulary — the same
evidence whether the model is only on disk (`mlx models info`) or loaded (the engine) — and
can be named explicitly (`--tool-format`) for the rare model that hides its markup.

Each dialect says where a tool-call span starts and ends in the output, how its arguments are
written (JSON text that can be streamed as it comes, parameters that close one by one, or
something else), which tool-call ids the family expects, and, for families mlx-lm does not
recognise, its think markers. The parsers themselves live in the engine (`engine/output`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

# How a family's template and parser want tool-call ids (see `engine/tool_ids.py`).
IdStyle = Literal["any", "alnum9", "functions_index"]
# How arguments are written: "json" (an object, streamable character by character),
# "params" (one parameter per element, each final when its element closes), "other".
ArgumentShape = Literal["json", "params", "other"]
# How a parameter family's parser turns a value's text into a value (each name is one pair of
# functions in the engine: which values the grammar writes as raw text, and how the reader
# converts them): Qwen3-Coder's type names, GLM's JSON-or-literal, MiniMax's type order,
# DeepSeek-V3.2's `string="true|false"` attribute, or every value JSON.
ValueTyping = Literal["qwen3_coder", "glm", "minimax", "dsml", "json"]


@dataclass(frozen=True)
class ParamElements:
    """A call written as elements: the tool's name, then one element per parameter, each final
    when it closes (Qwen3-Coder, GLM, MiniMax, DeepSeek-V3.2 …). One call reads

        lead call_open NAME name_close gap
        (param_open KEY key_close [gap value_open] pad VALUE pad value_close gap)*
        [call_close gap]

    with NAME and KEY in double quotes when `quoted`. The grammar writes exactly this; the
    reader also takes the looser forms the family's own parser takes (blank lines, a missing
    `>` where `lenient`).

    Attributes:
        call_open: the text before the name (None: the name opens the call, right after the
            span's start marker).
        name_close: the text after the name ("": the name ends at `gap` or the first element).
        param_open, key_close: around a parameter's name.
        value_close: the text that ends a value.
        call_close: the text that ends a call (None: the span's end marker ends it).
        value_open: the text before a value, after its name ("": none).
        quoted: names are written in double quotes (`name="Bash"`).
        lead: text between the span's start marker and the call (Qwen3-Coder's newline).
        pad: text on each side of a value that is markup, not value (Qwen3-Coder's newlines).
        gap: the text between elements; `gap_optional`: it may be left out.
        tag_tokens: the element tags are the tokenizer's own tokens (GLM's `<arg_key>`).
        lenient: a name or key may end at a newline, its `>` missing (mlx-lm's Qwen3-Coder).
        values: how values are typed (see `ValueTyping`).
        python_booleans: the template writes booleans as True/False (Jinja's `string`).
        string_attribute: each parameter says `string="true|false"` (DSML).
        strip_values: the parser strips whitespace around a value.
        json_body: the call may instead be a JSON object (GLM's, LongCat's parsers take both).
        streamed: our reader reads this family's spans (False: mlx-lm's parser does).
    """

    call_open: str | None
    name_close: str
    param_open: str
    key_close: str
    value_close: str
    call_close: str | None = None
    value_open: str = ""
    quoted: bool = False
    lead: str = ""
    pad: str = ""
    gap: str = ""
    gap_optional: bool = False
    tag_tokens: bool = False
    lenient: bool = False
    values: ValueTyping = "json"
    python_booleans: bool = False
    string_attribute: bool = False
    strip_values: bool = False
    json_body: bool = False
    streamed: bool = True


@dataclass(frozen=True)
class JsonEnvelope:
    """A call whose arguments are one JSON object, in an envelope that names the tool.

    Either a named object, `lead {"name": NAME, "<named_object>": {…}} trail` (Hermes, Llama),
    or markers around the name: `call_open NAME [call_id ID] arguments_open {…} call_close`
    (Kimi, Mistral, DeepSeek-V3.1). Kimi's id style (`functions_index`) writes the name as
    `functions.NAME:INDEX`. The grammar writes exactly this; the reader takes whitespace
    between the parts.

    Attributes:
        named_object: the key of the arguments in a named object (None: markers).
        call_open, arguments_open, call_close: the markers around name and arguments.
        call_id: the marker before a call id, written where the template checks ids
            (`id_style` "alnum9"), read wherever it comes.
        lead, trail: text around a named object inside its span.
        fenced: also read DeepSeek V3/R1's `function<sep>NAME ```json {…}``` ` form.
        reads_json_values: a span the reader cannot stream may be JSON call objects (read
            whole at its end: Mistral's older `[{"name": …}]`).
    """

    named_object: str | None = None
    call_open: str = ""
    arguments_open: str = ""
    call_close: str = ""
    call_id: str | None = None
    lead: str = ""
    trail: str = ""
    fenced: bool = False
    reads_json_values: bool = False


@dataclass(frozen=True)
class Notation:
    """A call in a notation of the family's own, with a grammar builder of its own in the
    engine (`kind`) and mlx-lm's parser as its reader: Gemma 4's `call:NAME{key:<|"|>v<|"|>}`,
    pythonic `NAME(key=value)`. (A call whose input is one raw string, such as a freeform
    custom tool, would be one more record type beside these.)"""

    kind: Literal["gemma4", "pythonic"]


CallMarkup = ParamElements | JsonEnvelope | Notation


@dataclass(frozen=True)
class Dialect:
    """One family's tool-call and thinking syntax: everything the constraint grammar and the
    streaming reader are generated from.

    Attributes:
        name: the format's name (mlx-lm's tool-parser name where mlx-lm has one).
        tool_call_start: the marker that opens a tool-call span (None: the family has no
            marker-delimited spans; `channels` or `leading_call` say how calls appear).
        tool_call_end: the marker that closes it ("" : the span runs to the end of the output).
        markup: how one call is written inside the span (None: no grammar, no reader of ours).
        arguments: how the arguments are written (from `markup` where there is one).
        id_style: the tool-call ids the template and parser expect.
        think_start, think_end: think markers, when mlx-lm does not infer them.
        channels: harmony (gpt-oss): output is a sequence of channel messages, not markup.
        leading_call: the output is a call when it starts with this text (Llama 3's bare JSON);
            the grammar then writes the call as the whole output, one per turn.
        mlx_lm_parser: mlx-lm reads this format (`mlx_lm.tool_parsers.<name>`).
        section: all of a turn's calls are in one span (else each call has a span of its own).
        section_open, section_close: text right inside a section's markers.
        separator: text between two calls; `separator_optional`: it may be left out.
        detected_by: markup in a chat template that shows this family: any of these sets,
            every string of the set in the template (`detect_dialect` tries the families in
            `DIALECTS` order, the more specific first).
        vocab_evidence: with no template evidence, the span markers in the vocabulary show
            the family.
    """

    name: str
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    markup: CallMarkup | None = None
    arguments: ArgumentShape = "other"
    id_style: IdStyle = "any"
    think_start: str | None = None
    think_end: str | None = None
    channels: bool = False
    leading_call: str | None = None
    mlx_lm_parser: bool = True
    section: bool = False
    section_open: str = ""
    section_close: str = ""
    separator: str = ""
    separator_optional: bool = False
    detected_by: tuple[tuple[str, ...], ...] = ()
    vocab_evidence: bool = False

    def __post_init__(self) -> None:
        shape = _SHAPES.get(type(self.markup))
        if shape is None:
            return
        if self.arguments not in ("other", shape):
            raise ValueError(f"{self.name}: arguments {self.arguments!r} but {shape!r} markup")
        object.__setattr__(self, "arguments", shape)


_SHAPES: dict[type, ArgumentShape] = {ParamElements: "params", JsonEnvelope: "json"}

HARMONY = Dialect(
    name="harmony",
    arguments="json",
    channels=True,
    mlx_lm_parser=False,
    detected_by=(("<|channel|>", "<|call|>"),),
)


def _invoke_elements(namespace: str, **changes: Any) -> ParamElements:
    """`<NSinvoke name="NAME">\\n<NSparameter name="K">V</NSparameter>\\n…</NSinvoke>\\n`, NS
    the family's namespace: MiniMax's none, DeepSeek-V3.2's `｜DSML｜`, Muse Spark's `atem:`."""
    return ParamElements(
        call_open=f"<{namespace}invoke name=",
        name_close=">",
        param_open=f"<{namespace}parameter name=",
        key_close=">",
        value_close=f"</{namespace}parameter>",
        call_close=f"</{namespace}invoke>",
        quoted=True,
        gap="\n",
        **changes,
    )


def _glm_like(name: str, prefix: str, evidence: str) -> Dialect:
    """GLM's markup (`NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>…`, newlines
    optional: GLM 4.7 drops them); LongCat writes the same with `longcat_` tags."""
    return Dialect(
        name,
        f"<{prefix}tool_call>",
        f"</{prefix}tool_call>",
        ParamElements(
            call_open=None,
            name_close="",
            param_open=f"<{prefix}arg_key>",
            key_close=f"</{prefix}arg_key>",
            value_open=f"<{prefix}arg_value>",
            value_close=f"</{prefix}arg_value>",
            gap="\n",
            gap_optional=True,
            tag_tokens=True,
            values="glm",
            strip_values=True,
            json_body=True,
        ),
        separator="\n",
        separator_optional=True,
        detected_by=((evidence,),),
    )


DSML = "｜DSML｜"
# <｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="p" string="true">v
# </｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls> (｜ is U+FF5C)
DEEPSEEK_V32 = Dialect(
    "deepseek_v32",
    f"<{DSML}function_calls>",
    f"</{DSML}function_calls>",
    _invoke_elements(DSML, values="dsml", string_attribute=True),
    mlx_lm_parser=False,
    section=True,
    section_open="\n",
    detected_by=((DSML,),),
)
# <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>Bash<｜tool▁sep｜>{…}<｜tool▁call▁end｜>
# <｜tool▁calls▁end｜>
DEEPSEEK_V31 = Dialect(
    "deepseek_v31",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    JsonEnvelope(
        None, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", fenced=True
    ),
    mlx_lm_parser=False,
    section=True,
    detected_by=(("<｜tool▁calls▁begin｜>",),),
)
# {"name": "Bash", "parameters": {…}} as the whole output (the Llama 3.3 template writes no
# <|python_tag|>)
LLAMA3_JSON = Dialect(
    "llama3_json",
    "<|python_tag|>",
    "",
    JsonEnvelope("parameters"),
    leading_call="{",
    mlx_lm_parser=False,
    detected_by=(("<|python_tag|>",), ('"parameters": ', "<|start_header_id|>")),
)

# A template's own JSON call syntax, learned by rendering a probe call through it
# (`engine/runtime/learned_syntax.py`) for markup no record below knows; its markers are
# filled in per model. Not a `--tool-format` choice.
LEARNED_JSON = Dialect(name="template_json", arguments="json", mlx_lm_parser=False)

# Every dialect by name (what `--tool-format` accepts), in the order templates are matched
# against their `detected_by` markup: the more specific first (a Qwen3-Coder template also
# contains <tool_call>; harmony's before anything JSON-ish).
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        HARMONY,
        DEEPSEEK_V32,
        DEEPSEEK_V31,
        # <minimax:tool_call>\n<invoke name="Bash">\n<parameter name="command">ls</parameter>\n
        # </invoke>\n</minimax:tool_call>
        Dialect(
            "minimax_m2",
            "<minimax:tool_call>",
            "</minimax:tool_call>",
            _invoke_elements("", values="minimax", strip_values=True),
            section=True,
            section_open="\n",
            detected_by=(("<minimax:tool_call>",),),
        ),
        Dialect(
            "gemma4",
            "<|tool_call>",
            "<tool_call|>",
            Notation("gemma4"),
            detected_by=(("<|tool_call>", "<tool_call|>"),),
        ),
        Dialect(
            "function_gemma",
            "<start_function_call>",
            "<end_function_call>",
            detected_by=(("<start_function_call>",),),
        ),
        _glm_like("longcat", "longcat_", "<longcat_tool_call>"),
        _glm_like("glm47", "", "<arg_key>"),
        # <|tool_call_start|>[Bash(command="ls"), Read(path="a")]<|tool_call_end|> (LFM2)
        Dialect(
            "pythonic",
            "<|tool_call_start|>",
            "<|tool_call_end|>",
            Notation("pythonic"),
            section=True,
            section_open="[",
            section_close="]",
            separator=", ",
            detected_by=(("<|tool_call_start|>",), ("<|tool_list_start|>",)),
            vocab_evidence=True,
        ),
        # <tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n
        # </tool_call>
        Dialect(
            "qwen3_coder",
            "<tool_call>",
            "</tool_call>",
            ParamElements(
                *("<function=", ">", "<parameter=", ">", "</parameter>", "</function>"),
                lead="\n",
                pad="\n",  # a value on its own lines
                gap="\n",
                lenient=True,
                values="qwen3_coder",
                python_booleans=True,  # the template writes `value | string`: True, False
            ),
            separator="\n",
            detected_by=(("<tool_call>\\n<function=",), ("<tool_call>\n<function=",)),
        ),
        # <|tool_calls_section_begin|><|tool_call_begin|>functions.Bash:0
        # <|tool_call_argument_begin|>{…}<|tool_call_end|><|tool_calls_section_end|>
        Dialect(
            "kimi_k2",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            JsonEnvelope(
                None, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
            ),
            id_style="functions_index",
            section=True,
            detected_by=(("<|tool_calls_section_begin|>",),),
        ),
        # <function name="Bash"><param name="command">ls</param></function>, one after another
        Dialect(
            "minicpm5",
            "<function name=",
            "</function>",
            ParamElements(
                *(None, ">", "<param name=", ">", "</param>"),
                quoted=True,
                values="minimax",  # MiniMax's parser's typing
                streamed=False,
            ),
            separator="\n",
            separator_optional=True,
            detected_by=(('<function name="', '<param name="'),),
        ),
        # [TOOL_CALLS]Bash[ARGS]{…}, or Bash[CALL_ID]a1b2c3d4e[ARGS]{…}; each call opens with
        # its own [TOOL_CALLS] and the output's end closes the last.
        Dialect(
            "mistral",
            "[TOOL_CALLS]",
            "",
            JsonEnvelope(arguments_open="[ARGS]", call_id="[CALL_ID]", reads_json_values=True),
            detected_by=(("[TOOL_CALLS]",),),
        ),
        # <atem:function_calls><atem:invoke name="Bash"><atem:parameter name="command">"ls"
        # </atem:parameter></atem:invoke></atem:function_calls>; its parser JSON-decodes every
        # value first, so every value is written as JSON; newlines between elements optional.
        Dialect(
            "muse_spark",
            "<atem:function_calls>",
            "</atem:function_calls>",
            _invoke_elements("atem:", gap_optional=True, values="json", streamed=False),
            section=True,
            detected_by=(("<atem:function_calls>",),),
        ),
        # <tool_call>\n{"name": "Bash", "arguments": {…}}\n</tool_call> (Qwen, Hermes)
        Dialect(
            "json_tools",
            "<tool_call>",
            "</tool_call>",
            JsonEnvelope(named_object="arguments", lead="\n", trail="\n"),
            separator="\n",
            detected_by=(("<tool_call>", "tool_call.name"),),
        ),
        LLAMA3_JSON,
    )
}

# Think markers mlx-lm does not look for: (start, end) when both are in the vocabulary.
EXTRA_THINK_MARKERS: tuple[tuple[str, str], ...] = (("[THINK]", "[/THINK]"),)


def detect_dialect(chat_template: str | None, vocab: Collection[str]) -> Dialect | None:
    """The dialect of a model with this chat template and vocabulary, or None (no tool calls).

    Where the template writes ids in a form it checks (Mistral's `[CALL_ID]`), the dialect asks
    for that form; think markers mlx-lm misses are added when the vocabulary holds them."""
    found = _from_template(chat_template) if chat_template else None
    if found is None:
        found = next((d for d in DIALECTS.values() if d.vocab_evidence and _in(d, vocab)), None)
    think = next(((s, e) for s, e in EXTRA_THINK_MARKERS if s in vocab and e in vocab), None)
    if found is None:
        return None if think is None else Dialect("none", think_start=think[0], think_end=think[1])
    found = with_template_ids(found, chat_template)
    if think is not None and found.think_start is None:
        found = _replace(found, think_start=think[0], think_end=think[1])
    return found


def with_template_ids(dialect: Dialect, chat_template: str | None) -> Dialect:
    """`dialect`, asking for ids in the form its template checks: a family that writes an id
    only where the template shows the id's marker (Mistral Small 3.2's `[CALL_ID]`)."""
    markup = dialect.markup
    if not isinstance(markup, JsonEnvelope) or not markup.call_id or dialect.id_style != "any":
        return dialect
    if chat_template and markup.call_id in chat_template:
        return _replace(dialect, id_style="alnum9")
    return dialect


def _in(dialect: Dialect, vocab: Collection[str]) -> bool:
    return dialect.tool_call_start in vocab and dialect.tool_call_end in vocab


def dialect_named(name: str) -> Dialect:
    """The dialect `name` (for `--tool-format`); ValueError lists the known names."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r} (known: {', '.join(sorted(DIALECTS))})"
        ) from None


def _from_template(chat_template: str) -> Dialect | None:
    for dialect in DIALECTS.values():
        if any(all(m in chat_template for m in markers) for markers in dialect.detected_by):
            return dialect
    return None


def _replace(dialect: Dialect, **changes: str | None) -> Dialect:
    return dataclasses.replace(dialect, **changes)  # type: ignore[arg-type]
