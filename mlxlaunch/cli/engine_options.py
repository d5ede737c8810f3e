"""The engine options of `mlx serve` and `mlx launch <agent>`, declared once for both.

`ENGINE_OPTIONS` holds one Typer option per field of `EngineOptions` (launch/options.py),
its default that field's default. `takes_engine_options` puts them all into a command's
signature where the command has an `engine: EngineOptions` parameter, and hands the command
the parsed options as one `EngineOptions`. A new engine option is a field there and a row
here (a test checks that every field has one); every serving command then takes it, and it
reaches the engine and every rank of a cluster with no further copying.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from copy import copy
from typing import Annotated, Any, TypeVar, get_args, get_origin

from mlxlaunch.cli.cache_options import (
    CacheDirOption,
    CacheDiskOption,
    CacheMemoryOption,
    DebugCacheOption,
    SafeguardsOption,
)
from mlxlaunch.cli.scheduler_options import (
    ContextLengthOption,
    DraftModelOption,
    IdleClearOption,
    KeepAliveOption,
    KvBitsOption,
    KvGroupSizeOption,
    MaxConcurrencyOption,
    MemoryFractionOption,
    RenderOption,
    SpeculateOption,
    ToolFormatOption,
)
from mlxlaunch.launch.options import EngineOptions

# EngineOptions field -> its option, in the order `--help` lists them.
ENGINE_OPTIONS: Mapping[str, Any] = {
    "context_length": ContextLengthOption,
    "max_concurrency": MaxConcurrencyOption,
    "idle_clear": IdleClearOption,
    "keep_alive": KeepAliveOption,
    "memory_fraction": MemoryFractionOption,
    "cache_memory": CacheMemoryOption,
    "cache_dir": CacheDirOption,
    "cache_disk": CacheDiskOption,
    "tool_format": ToolFormatOption,
    "render": RenderOption,
    "speculate": SpeculateOption,
    "draft_model": DraftModelOption,
    "kv_bits": KvBitsOption,
    "kv_group_size": KvGroupSizeOption,
    "debug_cache": DebugCacheOption,
    "safeguards": SafeguardsOption,
}

ENGINE_PARAMETER = "engine"
# The default a command writes for that parameter (Python wants one); never seen by Typer.
ENGINE_DEFAULTS = EngineOptions()
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineOptions)}

Command = TypeVar("Command", bound=Callable[..., Any])


def _hidden(option: Any) -> Any:
    """`option` (an Annotated Typer option) kept working but left out of `--help`."""
    base, *infos = get_args(option)
    shown = [copy(info) for info in infos]
    for info in shown:
        info.hidden = True
    return Annotated[(base, *shown)] if get_origin(option) is Annotated else option


def engine_parameters(
    hidden: Collection[str] = (), replaced: Mapping[str, Any] | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per engine option (`hidden`: fields taken but not shown;
    `replaced`: fields whose option this command spells its own way)."""
    options = {**ENGINE_OPTIONS, **(replaced or {})}
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=_hidden(option) if name in hidden else option,
            default=_DEFAULTS[name],
        )
        for name, option in options.items()
    ]


def takes_engine_options(
    hidden: Collection[str] = (), replaced: Mapping[str, Any] | None = None
) -> Callable[[Command], Command]:
    """Give a command every engine option in place of its `engine: EngineOptions` parameter.

    Args:
        hidden: fields the command takes without showing them in `--help` (e.g.
            `safeguards`, which only Claude Code asks about).
        replaced: fields whose option differs for this command (e.g. `mlx serve` only warns
            about a window too small for Claude Code, where `mlx launch` refuses it).
    """
    unknown = set(replaced or {}) - set(ENGINE_OPTIONS)
    assert not unknown, f"not engine options: {sorted(unknown)}"

    def wrap(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index(ENGINE_PARAMETER)
        params[at : at + 1] = engine_parameters(hidden, replaced)

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            engine = EngineOptions(**{name: given.pop(name) for name in ENGINE_OPTIONS})
            return command(**given, **{ENGINE_PARAMETER: engine})

        # Typer reads the parameters from the signature and their types from the annotations.
        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__
        return run  # type: ignore[return-value]

    return wrap
