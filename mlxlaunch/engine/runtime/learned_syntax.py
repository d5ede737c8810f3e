"""Learning a tool-call syntax from the chat template itself, for families no table knows.

A model whose template writes tool calls in markup the dialect table (`store/dialects.py`) has
never seen — Phi-4's `<|tool_call|>[…]<|/tool_call|>`, Granite's `<|tool_call|>[…]`, a fine-tune's
own tags — still shows how it writes them: render an assistant turn with one probe call through
the template and look at the text. When the call is a JSON value holding the probe's name and
arguments (an object `{"name": …, "arguments": …}` or a list of them, the most common shape by
far), the text before it is the call's start marker, the text after it (minus the turn's end,
learned the same way from a plain answer) its end marker, and the output parser reads spans
between them as JSON calls. Nothing is guessed from names: a template whose probe call is not
such a JSON value learns nothing, and its markup stays text.

Think markers are learned the same way (`learn_think_markers`): an assistant turn with probe
reasoning, rendered, shows the tags the template puts around it — `<seed:think>` …
`</seed:think>`, a fine-tune's `<reasoning>` — when they are a tag and its closing form (`<x>`
and `</x>`, `[X]` and `[/X]`) right around the reasoning, and the output parser then reads
what the model writes between them as thinking, never as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBE_NAME = "mlxlaunch_probe_tool"
PROBE_VALUE = "mlxlaunch-probe-value"
PROBE_ARGUMENTS = {"probe_argument": PROBE_VALUE}
PLAIN_ANSWER = "mlxlaunch-probe-answer"
PROBE_REASONING = "mlxlaunch-probe-reasoning"
# The fields chat templates read an assistant turn's reasoning from.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
_OPEN_TAG = re.compile(r"(<[^<>/\s][^<>\s]{0,63}>|\[[^\[\]/\s][^\[\]\s]{0,63}\])$")
_CLOSE_TAG = re.compile(r"^(</[^<>\s]{1,64}>|\[/[^\[\]\s]{1,64}\])")

# (messages, tools, add_generation_prompt) -> prompt text.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]


@dataclass(frozen=True)
class LearnedCallSyntax:
    """Where a template's JSON tool calls start and end in the model's output."""

    start: str  # "" : the call is the output itself (it starts with `leading`)
    end: str  # "" : the span runs to the end of the output
    leading: str  # the first character of the JSON value ("{" or "[")


def learn_json_call_syntax(render: Render) -> LearnedCallSyntax | None:
    """The JSON call syntax `render`'s template writes, or None when it writes none."""
    user = [{"role": "user", "content": "hi"}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": PROBE_NAME,
                "description": "probe",
                "parameters": {
                    "type": "object",
                    "properties": {"probe_argument": {"type": "string"}},
                },
            },
        }
    ]
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": PROBE_NAME, "arguments": PROBE_ARGUMENTS},
    }
    try:
        with_call = render(
            [*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tools, False
        )
        with_answer = render([*user, {"role": "assistant", "content": PLAIN_ANSWER}], tools, False)
    except Exception:  # a template that refuses the probe shows nothing to learn from
        return None
    # Both turns share the conversation and the assistant's header: what differs is what the
    # model writes (a template may put its tool list after the messages: no generation prompt
    # is compared, so that cannot get in the way).
    turn = _after_shared(with_answer, with_call)
    answer = _after_shared(with_call, with_answer)
    if not answer.startswith(PLAIN_ANSWER):
        return None
    turn_end = answer[answer.index(PLAIN_ANSWER) + len(PLAIN_ANSWER) :]
    found = _probe_call_value(turn)
    if found is None:
        return None
    begin, finish = found
    start = turn[:begin].strip()
    after = turn[finish:]
    if turn_end.strip() and after.rstrip().endswith(turn_end.strip()):
        after = after.rstrip()[: -len(turn_end.strip())]
    return LearnedCallSyntax(start=start, end=after.strip(), leading=turn[begin])


def _after_shared(other: str, rendered: str) -> str:
    """`rendered` past the longest prefix it shares with `other`."""
    shared = 0
    limit = min(len(other), len(rendered))
    while shared < limit and other[shared] == rendered[shared]:
        shared += 1
    return rendered[shared:]


def _probe_call_value(turn: str) -> tuple[int, int] | None:
    """(start, end) of the JSON value in `turn` that is the probe call, or None."""
    name_at = turn.find(PROBE_NAME)
    value_at = turn.find(PROBE_VALUE)
    if name_at < 0 or value_at < 0:
        return None
    first = min(name_at, value_at)
    decoder = json.JSONDecoder()
    # The outermost value that parses and is the call (a list of one call, not the call in it).
    found: tuple[int, int] | None = None
    for begin in range(first, -1, -1):
        if turn[begin] not in "{[":
            continue
        try:
            value, finish = decoder.raw_decode(turn, begin)
        except ValueError:
            continue
        if finish > max(name_at, value_at) and _is_probe_call(value):
            found = (begin, finish)
    return found


def _is_probe_call(value: Any) -> bool:
    if isinstance(value, list):
        return len(value) == 1 and _is_probe_call(value[0])
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("function"), dict):
        value = value["function"]
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False
    return bool(value.get("name") == PROBE_NAME and arguments == PROBE_ARGUMENTS)


def learn_think_markers(render: Render) -> tuple[str, str] | None:
    """The (start, end) tags `render`'s template writes around an assistant's reasoning, or
    None when it writes none (or no reasoning at all)."""
    for field in REASONING_FIELDS:
        turn = {"role": "assistant", "content": PLAIN_ANSWER, field: PROBE_REASONING}
        text = _rendered(render, [{"role": "user", "content": "hi"}, turn])
        if text is None:
            continue
        at = text.find(PROBE_REASONING)
        if at < 0 or text.find(PLAIN_ANSWER, at) < 0:
            continue
        opening = _OPEN_TAG.search(text[:at].rstrip())
        closing = _CLOSE_TAG.match(text[at + len(PROBE_REASONING) :].lstrip())
        if opening is None or closing is None:
            return None
        start, end = opening.group(1), closing.group(1)
        if end == start[0] + "/" + start[1:]:
            return start, end
        return None
    return None


def _rendered(render: Render, messages: list[dict[str, Any]]) -> str | None:
    """The messages rendered without tools (as None, else as an empty list, for a template
    that iterates them), or None when the template refuses both."""
    no_tools: tuple[list[dict[str, Any]] | None, ...] = (None, [])
    for tools in no_tools:
        try:
            return render(messages, tools, False)
        except Exception:  # a template that refuses the probe shows nothing to learn from
            continue
    return None
