"""A tokenizer double for the prompt tests: only what the renderer uses of a tokenizer, a chat
template applied the way transformers applies it."""

from __future__ import annotations

import datetime
import json
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """What a template's `raise_exception(...)` raises."""


def _raise(message: str) -> None:
    raise TemplateError(message)


class TemplateTokenizer:
    """A chat template and applying it. Like transformers: `trim_blocks` and `lstrip_blocks`,
    loop controls, `raise_exception` and a `strftime_now` global (here on a settable clock,
    `today`), extra keyword arguments in the render context, and `chat_template=` to render
    another template text. `renders` counts the renders."""

    def __init__(self, chat_template: str, today: datetime.date | None = None) -> None:
        self.chat_template = chat_template
        self.today = today or datetime.date.today()
        self.renders = 0
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda format: self.today.strftime(format)
        env.filters["tojson"] = lambda value, **kwargs: json.dumps(value, **kwargs)
        self._env = env
        self._compiled: dict[str, Any] = {}  # source -> template: each compiled once

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        assert not tokenize
        self.renders += 1
        # Compiling gpt-oss's template takes a good part of a second and probing renders it
        # dozens of times; a test that swaps `chat_template` gets the new one compiled.
        source = chat_template or self.chat_template
        if source not in self._compiled:
            self._compiled[source] = self._env.from_string(source)
        return str(
            self._compiled[source].render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        )
