"""Mid-conversation system turns, rendered in place whatever the chat template allows.

Anthropic clients send `role: "system"` messages mid-conversation (operator instructions right
after a user turn). They must stay where they are: folding them into the top-level system
prompt would change the start of every later prompt and defeat prefix reuse. Many templates
render a system turn anywhere; some raise ("roles must alternate") and some silently drop
every system message but the first. For those, the instruction goes into the adjacent user
turn, clearly marked, so the model still sees it at its place.

Whether a template renders system turns is probed once per tokenizer, by rendering a tiny
conversation with a marked system turn and looking for the mark.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlxlaunch.engine.types import ChatMessage

INSTRUCTION_OPEN = "<system-instruction>"
INSTRUCTION_CLOSE = "</system-instruction>"
_PROBE_MARK = "mlxlaunch-system-turn-probe"


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
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "system", "content": _PROBE_MARK},
        ]
        try:
            text = self._tokenizer.apply_chat_template(
                probe, add_generation_prompt=True, tokenize=False
            )
        except Exception:  # templates raise on roles they refuse
            return False
        return _PROBE_MARK in str(text)
