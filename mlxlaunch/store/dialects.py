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
from typing import Literal

# How a family's template and parser want tool-call ids (see `engine/tool_ids.py`).
IdStyle = Literal["any", "alnum9", "functions_index"]
# How arguments are written: "json" (an object, streamable character by character),
# "params" (one parameter per element, each final when its element closes), "other".
ArgumentShape = Literal["json", "params", "other"]


@dataclass(frozen=True)
class Dialect:
    """One family's tool-call and thinking syntax.

    Attributes:
        name: the format's name (mlx-lm's tool-parser name where mlx-lm has one).
        tool_call_start: the marker that opens a tool-call span (None: the family has no
            marker-delimited spans; `channels` or `leading_call` say how calls appear).
        tool_call_end: the marker that closes it ("" : the span runs to the end of the output).
        arguments: how the arguments are written.
        id_style: the tool-call ids the template and parser expect.
        think_start, think_end: think markers, when mlx-lm does not infer them.
        channels: harmony (gpt-oss): output is a sequence of channel messages, not markup.
        leading_call: the output is a call when it starts with this text (Llama 3's bare JSON).
        mlx_lm_parser: mlx-lm reads this format (`mlx_lm.tool_parsers.<name>`).
    """

    name: str
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    arguments: ArgumentShape = "other"
    id_style: IdStyle = "any"
    think_start: str | None = None
    think_end: str | None = None
    channels: bool = False
    leading_call: str | None = None
    mlx_lm_parser: bool = True


HARMONY = Dialect(name="harmony", arguments="json", channels=True, mlx_lm_parser=False)
DEEPSEEK_V31 = Dialect(
    name="deepseek_v31",
    tool_call_start="<｜tool▁calls▁begin｜>",
    tool_call_end="<｜tool▁calls▁end｜>",
    arguments="json",
    mlx_lm_parser=False,
)
DEEPSEEK_V32 = Dialect(
    name="deepseek_v32",
    tool_call_start="<｜DSML｜function_calls>",
    tool_call_end="</｜DSML｜function_calls>",
    arguments="params",
    mlx_lm_parser=False,
)
LLAMA3_JSON = Dialect(
    name="llama3_json",
    tool_call_start="<|python_tag|>",
    tool_call_end="",
    arguments="json",
    leading_call="{",
    mlx_lm_parser=False,
)

# A template's own JSON call syntax, learned by rendering a probe call through it
# (`engine/runtime/learned_syntax.py`) for markup no table below knows; its markers are filled
# in per model. Not a `--tool-format` choice.
LEARNED_JSON = Dialect(name="template_json", arguments="json", mlx_lm_parser=False)

# Every dialect by name (what `--tool-format` accepts).
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        HARMONY,
        DEEPSEEK_V31,
        DEEPSEEK_V32,
        LLAMA3_JSON,
        Dialect("json_tools", "<tool_call>", "</tool_call>", arguments="json"),
        Dialect("qwen3_coder", "<tool_call>", "</tool_call>", arguments="params"),
        Dialect("glm47", "<tool_call>", "</tool_call>", arguments="params"),
        Dialect("minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>", arguments="params"),
        Dialect(
            "kimi_k2",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            arguments="json",
            id_style="functions_index",
        ),
        Dialect("mistral", "[TOOL_CALLS]", "", arguments="json"),
        Dialect("gemma4", "<|tool_call>", "<tool_call|>"),
        Dialect("function_gemma", "<start_function_call>", "<end_function_call>"),
        Dialect("longcat", "<longcat_tool_call>", "</longcat_tool_call>", arguments="params"),
        Dialect("pythonic", "<|tool_call_start|>", "<|tool_call_end|>"),
        Dialect("minicpm5", "<function name=", "</function>", arguments="params"),
        Dialect("muse_spark", "<atem:function_calls>", "</atem:function_calls>"),
    )
}

# Markup in a chat template -> the dialect that writes it. Order matters: more specific first
# (a Qwen3-Coder template also contains <tool_call>; harmony's before anything JSON-ish).
TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "<|call|>"), "harmony"),
    (("｜DSML｜",), "deepseek_v32"),
    (("<｜tool▁calls▁begin｜>",), "deepseek_v31"),
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|tool_call>", "<tool_call|>"), "gemma4"),
    (("<start_function_call>",), "function_gemma"),
    (("<longcat_tool_call>",), "longcat"),
    (("<arg_key>",), "glm47"),
    (("<|tool_call_start|>",), "pythonic"),
    (("<|tool_list_start|>",), "pythonic"),
    (("<tool_call>\\n<function=",), "qwen3_coder"),
    (("<tool_call>\n<function=",), "qwen3_coder"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (('<function name="', '<param name="'), "minicpm5"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<atem:function_calls>",), "muse_spark"),
    (("<tool_call>", "tool_call.name"), "json_tools"),
    (("<|python_tag|>",), "llama3_json"),
    (('"parameters": ', "<|start_header_id|>"), "llama3_json"),
)

# Think markers mlx-lm does not look for: (start, end) when both are in the vocabulary.
EXTRA_THINK_MARKERS: tuple[tuple[str, str], ...] = (("[THINK]", "[/THINK]"),)


def detect_dialect(chat_template: str | None, vocab: Collection[str]) -> Dialect | None:
    """The dialect of a model with this chat template and vocabulary, or None (no tool calls).

    Where the template writes ids in a form it checks (Mistral's `[CALL_ID]`), the dialect asks
    for that form; think markers mlx-lm misses are added when the vocabulary holds them."""
    found = _from_template(chat_template) if chat_template else None
    if found is None and "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab:
        found = DIALECTS["pythonic"]
    think = next(((s, e) for s, e in EXTRA_THINK_MARKERS if s in vocab and e in vocab), None)
    if found is None:
        return None if think is None else Dialect("none", think_start=think[0], think_end=think[1])
    if found.name == "mistral" and chat_template and "[CALL_ID]" in chat_template:
        found = _replace(found, id_style="alnum9")
    if think is not None and found.think_start is None:
        found = _replace(found, think_start=think[0], think_end=think[1])
    return found


def dialect_named(name: str) -> Dialect:
    """The dialect `name` (for `--tool-format`); ValueError lists the known names."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r} (known: {', '.join(sorted(DIALECTS))})"
        ) from None


def _from_template(chat_template: str) -> Dialect | None:
    for markers, name in TEMPLATE_MARKERS:
        if all(m in chat_template for m in markers):
            return DIALECTS[name]
    return None


def _replace(dialect: Dialect, **changes: str | None) -> Dialect:
    return dataclasses.replace(dialect, **changes)  # type: ignore[arg-type]
