"""Chat-template families for offline test models.

Each family pairs a Jinja chat template with the added tokens its syntax needs, so a test
model speaks one real tool-call dialect that mlx-lm recognises (it infers the tool parser
from the template text). Add a family by dropping a ``<name>.jinja`` file next to this
module and registering a :class:`TemplateFamily` in :data:`TEMPLATE_FAMILIES`.

Most families share ChatML turns (``_chatml_base.jinja``); their own file only defines the
think markers and two macros, ``tool_call(name, arguments)`` (history rendering) and
``tool_instructions()``, and carries the markers from which mlx-lm infers the tool parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path

# Control tokens: special (skipped by ``decode(skip_special_tokens=True)``), as in Qwen3.
QWEN_CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2-VL / Qwen2.5-VL's vision tokens (special, as in their tokenizers).
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Markup tokens: single ids that survive decoding, as in Qwen3's tokenizer.
QWEN_MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)


@dataclass(frozen=True)
class TemplateFamily:
    """One chat-template dialect: template text plus the tokens it needs.

    Attributes:
        name: registry key, passed as ``build_model(..., template=name)``.
        template_file: Jinja file in ``mlxlaunch/testing/templates/``.
        control_tokens: added tokens marked special (end of turn, role markers).
        markup_tokens: added tokens kept in decoded text (thinking and tool-call tags).
        eos_token: the token that ends an assistant turn.
        pad_token: padding token for the tokenizer config.
        tool_parser: the mlx-lm tool parser this template should make mlx-lm infer.
        base_file: a shared template appended after ``template_file`` (None: standalone).
    """

    name: str
    template_file: str
    control_tokens: tuple[str, ...]
    markup_tokens: tuple[str, ...]
    eos_token: str
    pad_token: str
    tool_parser: str | None
    base_file: str | None = None
    # Real templates (see `real_template_family`): the text itself, the BOS token the template
    # writes, and every token that ends generation (generation_config.json's eos list).
    template_text: str | None = None
    bos_token: str | None = None
    eos_tokens: tuple[str, ...] = ()

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """All added tokens, control tokens first (their ids follow the BPE vocabulary)."""
        return self.control_tokens + self.markup_tokens

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        """The tokens that end an assistant's output: EOS first."""
        return self.eos_tokens or (self.eos_token,)

    def chat_template(self) -> str:
        """The Jinja template text."""
        if self.template_text is not None:
            return self.template_text
        text = _read_template(self.template_file)
        if self.base_file is not None:
            text += _read_template(self.base_file)
        return text


@cache
def _read_template(file_name: str) -> str:
    return resources.files(__package__).joinpath("templates", file_name).read_text("utf-8")


_QWEN = TemplateFamily(
    name="qwen",
    template_file="qwen.jinja",
    control_tokens=QWEN_CONTROL_TOKENS,
    markup_tokens=QWEN_MARKUP_TOKENS,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    tool_parser="json_tools",
)

TEMPLATE_FAMILIES: dict[str, TemplateFamily] = {
    "qwen": _QWEN,
    # Same turns and tokens as "qwen"; tool calls as <function=...> and <parameter=...> lines.
    "qwen3_coder": replace(
        _QWEN, name="qwen3_coder", template_file="qwen3_coder.jinja", tool_parser="qwen3_coder"
    ),
    # Qwen2.5-VL's turns: "qwen" with its vision tokens (an image part renders as
    # <|vision_start|><|image_pad|><|vision_end|>, which the processor widens to the image's
    # grid). For the `tiny-vision` model (testing/vision.py).
    "qwen_vl": replace(
        _QWEN, name="qwen_vl", control_tokens=QWEN_CONTROL_TOKENS + QWEN_VISION_TOKENS
    ),
}

THINK_TOKENS = ("<think>", "</think>")
CHATML_BASE = "_chatml_base.jinja"

# Tool-syntax families on shared ChatML turns: name -> markup tokens beyond the think tags.
# The name is both the template file's stem and the mlx-lm parser it makes mlx-lm infer.
_SYNTAX_FAMILIES: dict[str, tuple[str, ...]] = {
    "mistral": ("[TOOL_CALLS]", "[ARGS]"),
    "glm47": (
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ),
    "minimax_m2": ("<minimax:tool_call>", "</minimax:tool_call>"),
    "pythonic": ("<|tool_call_start|>", "<|tool_call_end|>"),
    "longcat": (
        "<longcat_tool_call>",
        "</longcat_tool_call>",
        "<longcat_arg_key>",
        "</longcat_arg_key>",
        "<longcat_arg_value>",
        "</longcat_arg_value>",
    ),
    "minicpm5": (),  # its start marker `<function name=` is plain text in its tokenizer too
    "muse_spark": ("<atem:function_calls>", "</atem:function_calls>"),
    "function_gemma": ("<start_function_call>", "<end_function_call>", "<escape>"),
}
for _name, _markup in _SYNTAX_FAMILIES.items():
    TEMPLATE_FAMILIES[_name] = TemplateFamily(
        name=_name,
        template_file=f"{_name}.jinja",
        control_tokens=QWEN_CONTROL_TOKENS,
        markup_tokens=THINK_TOKENS + _markup,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        tool_parser=_name,
        base_file=CHATML_BASE,
    )
# Gemma 4 thinks in a channel (`<|channel>thought ... <channel|>`), not in <think> tags.
TEMPLATE_FAMILIES["gemma4"] = TemplateFamily(
    name="gemma4",
    template_file="gemma4.jinja",
    control_tokens=QWEN_CONTROL_TOKENS,
    markup_tokens=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>'),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    tool_parser="gemma4",
    base_file=CHATML_BASE,
)


def template_family(name: str) -> TemplateFamily:
    """Look up a template family by name; raises ``KeyError`` listing the known names."""
    try:
        return TEMPLATE_FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(TEMPLATE_FAMILIES))
        raise KeyError(f"unknown chat template family {name!r} (known: {known})") from None


def real_template_family(template: Path) -> TemplateFamily:
    """A family from a real model's chat template (`<family>.jinja`) and the facts about its
    tokenizer next to it (`<family>.tokens.json`: special tokens, non-special added tokens,
    bos/eos/pad, generation_config's eos list), as in `tests/fixtures/chat-templates/`.

    A test model built from it tokenizes and renders the way that model does: the same control
    tokens (special), the same markup tokens (kept in decoded text), the same stop tokens."""
    template = Path(template)
    facts = json.loads(template.with_suffix(".tokens.json").read_text("utf-8"))
    special = list(dict.fromkeys(facts["special_tokens"]))
    for key in ("bos_token", "eos_token", "pad_token"):
        token = facts.get(key)
        if token and token not in special:
            special.append(token)
    markup = [t for t in dict.fromkeys(facts["added_tokens_not_special"]) if t not in special]
    eos_tokens = tuple(facts.get("eos_tokens") or [facts["eos_token"]])
    for token in eos_tokens:
        if token not in special and token not in markup:
            special.append(token)
    return TemplateFamily(
        name=str(facts["family"]),
        template_file=template.name,
        control_tokens=tuple(special),
        markup_tokens=tuple(markup),
        eos_token=str(facts["eos_token"]),
        pad_token=str(facts.get("pad_token") or facts["eos_token"]),
        tool_parser=None,
        template_text=template.read_text("utf-8"),
        bos_token=facts.get("bos_token"),
        eos_tokens=eos_tokens,
    )
