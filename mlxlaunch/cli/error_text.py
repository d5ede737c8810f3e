"""Typed errors into words at the CLI edge: one table, one row per error that needs the CLI's.

Errors carry data (mlxlaunch/store/errors.py and the others); what a user should run next
names commands and flags, which only the CLI knows. `error_text(exc)` finds the row of the
nearest class in the error's ancestry; an error without a row says its own message and hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxlaunch.errors import DefaultModelMissing, MlxLaunchError
from mlxlaunch.store.errors import (
    BadShardSpec,
    ModelInUse,
    ModelNotDownloaded,
    NoSuchRevision,
    NotAHubName,
    NotAnMlxModel,
    NotLocal,
    UnknownModel,
)

Text = tuple[str, str | None]  # (message, hint)

_SET_DEFAULT = "change it: mlx config set default-model NAME, or mlx config unset default-model"


def _default_model(exc: DefaultModelMissing) -> Text:
    message, hint = error_text(exc.cause)
    return (
        f"{message}: '{exc.name}' is the default-model setting{exc.where}",
        f"{hint}; or {_SET_DEFAULT}" if hint else _SET_DEFAULT,
    )


def _shard(exc: BadShardSpec) -> Text:
    if exc.size is None:
        return f"--shard {exc.text!r}: expected RANK/SIZE, e.g. 1/2 (or 0,1/3)", None
    return f"--shard {exc.text!r}: ranks run from 0 to {exc.size - 1}", None


# Error class -> its words; one line of why where the row is not plain.
TABLE: dict[type[MlxLaunchError], Callable[[Any], Text]] = {
    ModelNotDownloaded: lambda e: (
        e.message,
        f"finish the download: mlx models pull {e.name}"
        if e.partly
        else f"download it first: mlx models pull {e.name}",
    ),
    UnknownModel: lambda e: (
        e.message,
        "see `mlx models list` (local) and `mlx models catalog` (aliases), "
        "or pull one: mlx models pull org/repo",
    ),
    NotAHubName: lambda e: (e.message, "see `mlx models catalog` for aliases"),
    NoSuchRevision: lambda e: (e.message, "check --revision"),
    NotLocal: lambda e: (e.message, "see `mlx models list`"),
    ModelInUse: lambda e: (e.message, "stop that server (or `mlx launch` session) first"),
    NotAnMlxModel: lambda e: (e.message, "pass --force to download it anyway"),
    BadShardSpec: _shard,  # the flag is the CLI's: `mlx models pull --shard`
    DefaultModelMissing: _default_model,  # the cause's own words, then how to change it
}


def error_text(exc: MlxLaunchError) -> Text:
    """The message and hint to show for `exc`."""
    for kind in type(exc).__mro__:
        words = TABLE.get(kind)
        if words is not None:
            return words(exc)
    return exc.message, exc.hint
