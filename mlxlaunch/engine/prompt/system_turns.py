"""Mid-conversation system turns, rendered in place whatever the chat template allows.

Anthropic clients send `role: "system"` messages mid-conversation (operator instructions right
after a user turn). They must stay where they are: folding them into the top-level system
prompt would change the start of every later prompt and defeat prefix reuse. Many templates
render a system turn anywhere; some raise ("roles must alternate") and some silently drop
every system message but the first. For those, the instruction goes into the adjacent user
turn, clearly marked, so the model still sees it at its place.

Whether a template renders system turns is probed once per tokenizer, by rendering a tiny
conversation with a marked system turn between a user and an assistant turn, and looking for
the mark *in its place*: DeepSeek-V3.1's template moves every system message to the top
(which would change the start of the prompt on every such turn), and Mistral's accepts a
system turn after the last user turn but refuses the assistant turn that follows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlxlaunch.engine.types import ChatMessage

INSTRUCTION_OPEN = "<system-instruction>"
INSTRUCTION_CLOSE = "</system-instruction>"
_PROBE_MARK = "mlxlaunch-system-turn-probe"
# The probe conversation's other parts, in the order they must appear.
_PROBE_ORDER = ("mlxprobeUserOne", _PROBE_MARK, "mlxprobeAnswer", "mlxprobeUserTwo")


def marked_instruction(text: str) -> str:
    """A system instruction as it reads inside a user turn."""
    return f"{INSTRUCTION_OPEN}\n{text}\n{INSTRUCTION_CLOSE}"


def fold_system_turns(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Move mid-conversation system turns into the adjacent user turn (a leading system
    message, the top-level prompt, stays). Preference: the user turn just before, else the one
    just after, else a user turn of its own."""
    out: list[ChatMessage] = []
    carried: list[str] = []  # instructions waiting for the next user turn
    for index, message in enumerate(messages):
        if message.role != "system" or index == 0:
            if carried and message.role == "user":
                text = "\n\n".join([*carried, message.content])
                message = dataclasses.replace(message, content=text)
                carried = []
            elif carried:
                out.append(ChatMessage(role="user", content="\n\n".join(carried)))
                carried = []
            out.append(message)
            continue
        note = marked_instruction(message.content)
        previous = out[-1] if out else None
        if previous is not None and previous.role == "user":
            out[-1] = dataclasses.replace(previous, content=f"{previous.content}\n\n{note}")
        else:
            carried.append(note)
    if carried:
        out.append(ChatMessage(role="user", content="\n\n".join(carried)))
    return out


class SystemTurns:
    """Places system turns for one tokenizer's chat template.

    `place()` calls the template once (the probe) on first use, so call it where the
    tokenizer may be used (the renderer holds its tokenizer lock around it).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._supported: bool | None = None

    @property
    def supported(self) -> bool:
        """Whether the template renders a system turn after a user turn."""
        if self._supported is None:
            self._supported = self._probe()
        return self._supported

    def place(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """`messages` ready for the template: unchanged when it renders system turns, or
        with mid-conversation system turns folded into user turns."""
        if not any(m.role == "system" for m in messages[1:]):
            return messages
        return messages if self.supported else fold_system_turns(messages)

    def _probe(self) -> bool:
        return renders_system_turns(
            lambda messages: self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        )


def renders_system_turns(apply: Callable[[list[dict[str, Any]]], Any]) -> bool:
    """Whether the template `apply` renders (messages → prompt text) shows a system turn that
    follows a user turn where it stands, and renders the turns after it."""
    user, mark, answer, later = _PROBE_ORDER
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": user},
        {"role": "system", "content": mark},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": later},
    ]
    try:
        text = str(apply(probe))
    except Exception:  # templates raise on roles they refuse
        return False
    at = 0
    for part in _PROBE_ORDER:
        at = text.find(part, at)
        if at < 0:
            return False
    return True
