"""Engine scheduling options shared by `mlx serve` and `mlx launch <agent>`.

Their defaults are `EngineOptions`' (launch/options.py); cli/engine_options.py puts them on
every serving command.

Kept free of MLX imports so the CLI starts fast; durations are checked while parsing, so a bad
value fails before a model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from mlxlaunch.config import MIN_CONTEXT_LENGTH, check_context_length
from mlxlaunch.engine.settings import KV_BITS, KV_GROUP_SIZES, parse_duration
from mlxlaunch.store.dialects import DIALECTS, dialect_named


def _duration(value: str | None) -> str | None:
    if value is not None:
        try:
            parse_duration(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    return value


def _context_length(value: int | None) -> int | None:
    # The same rule as `mlx config set context-length`, with the same reason.
    if value is not None:
        try:
            check_context_length(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    return value


ContextLengthOption = Annotated[
    int | None,
    typer.Option(
        callback=_context_length,
        help=f"Context window to serve, in tokens (at least {MIN_CONTEXT_LENGTH}; "
        "default: the model's).",
    ),
]


def _context_length_warned(value: int | None) -> int | None:
    # `mlx serve` serves other clients too, and some use small windows: a warning only.
    if value is not None and value < MIN_CONTEXT_LENGTH:
        typer.echo(
            f"warning: --context-length {value} is below {MIN_CONTEXT_LENGTH}: Claude Code's "
            "system prompt and tools alone take ~15k tokens, so its requests will not fit",
            err=True,
        )
    return value


ServeContextLengthOption = Annotated[
    int | None,
    typer.Option(
        "--context-length",
        callback=_context_length_warned,
        min=2,
        help="Context window to serve, in tokens (default: the model's, capped by what "
        f"memory holds; below {MIN_CONTEXT_LENGTH} Claude Code's requests do not fit).",
    ),
]


def _kv_option(choices: tuple[int, ...], flag: str, text: str) -> Any:
    """An option whose value is one of `choices` (None: not given)."""

    def check(value: int | None) -> int | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{flag} {value}: one of {', '.join(map(str, choices))}")
        return value

    metavar = f"[{'|'.join(map(str, choices))}]"
    return typer.Option(callback=check, metavar=metavar, help=text, show_default=False)


KvBitsOption = Annotated[
    int | None,
    _kv_option(
        KV_BITS,
        "--kv-bits",
        "Hold the KV cache (running requests, prefix cache, saved prefixes) quantized to 8 or "
        "4 bits: a longer session in the same memory (default: the model's precision).",
    ),
]
KvGroupSizeOption = Annotated[
    int | None,
    _kv_option(
        KV_GROUP_SIZES,
        "--kv-group-size",
        "Values per quantization group with --kv-bits (default: 64, or what divides the "
        "model's head size).",
    ),
]
MaxConcurrencyOption = Annotated[
    int | None, typer.Option(min=1, help="Requests decoded together (default: 8).")
]
IdleClearOption = Annotated[
    str,
    typer.Option(
        callback=_duration,
        help="Clear MLX's buffer cache after this long without requests (e.g. 30s, never).",
    ),
]
KeepAliveOption = Annotated[
    str | None,
    typer.Option(
        callback=_duration,
        help="Unload the model after this long without requests; it reloads on the next "
        "one (e.g. 30m; 0: at once; default: stay loaded).",
        show_default=False,
    ),
]
MemoryFractionOption = Annotated[
    float,
    typer.Option(min=0.05, max=1.0, help="Share of RAM MLX may use (its memory limit)."),
]


def _tool_format(value: str | None) -> str | None:
    if value is not None:
        try:
            dialect_named(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    return value


ToolFormatOption = Annotated[
    str | None,
    typer.Option(
        callback=_tool_format,
        help="The model's tool-call format, for a model whose chat template does not show it "
        f"(default: detected). One of: {', '.join(sorted(DIALECTS))}.",
        show_default=False,
    ),
]


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parse callback that takes only `choices` (the engine's modes, spelled here so the
    CLI imports no MLX; a test checks them against the engine's)."""

    def check(value: str) -> str:
        if value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of: {', '.join(choices)}")
        return value

    return check


# Speculative decoding (`engine.config.SpeculateMode`).
SPECULATE_MODES = ("auto", "lookup", "draft", "off")
SpeculateOption = Annotated[
    str,
    typer.Option(
        callback=one_of(SPECULATE_MODES),
        metavar="[auto|lookup|draft|off]",
        help="Speculative decoding, verified in the batch's own forward pass (the output is "
        "what plain decoding gives). auto: the --draft-model if given, else drafts from the "
        "conversation itself (prompt lookup), where the model allows it; lookup, draft: that "
        "drafter, refused where it cannot run; off.",
    ),
]
DraftModelOption = Annotated[
    str | None,
    typer.Option(
        help="A small model with the main model's tokenizer whose greedy tokens are drafts "
        "(e.g. a 0.5B model of the same family).",
        metavar="MODEL",
        show_default=False,
    ),
]


# The engine's render modes (`engine.config.RenderMode`).
RENDER_MODES = ("stable", "exact")
RenderOption = Annotated[
    str,
    typer.Option(
        callback=one_of(RENDER_MODES),
        metavar="[stable|exact]",
        help="Prompt rendering. stable: each prompt extends the previous one, so the prefix "
        "cache reuses it (earlier reasoning is kept, a printed date pinned); exact: the chat "
        "template's own output.",
    ),
]
