"""Prefix-cache options shared by `mlx serve` and `mlx launch claude`.

Sizes are checked while parsing, so a bad value fails before a model loads. `--debug-cache`
is the one switch that lets prompt text into miss diagnostics (`EngineConfig.debug_cache`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlxlaunch.engine.settings import parse_size


def _size(value: str | None) -> str | None:
    if value is not None and value.strip().lower() != "auto":
        try:
            parse_size(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    return value


CacheMemoryOption = Annotated[
    str,
    typer.Option(
        callback=_size,
        help="Memory for cached prompt prefixes, e.g. 8G (auto: a quarter of RAM, at most "
        "8G; 0: no prefix cache).",
    ),
]
CacheDirOption = Annotated[
    Path | None,
    typer.Option(
        help="Directory for prefixes saved across restarts (default: under the user cache dir).",
        show_default=False,
    ),
]
CacheDiskOption = Annotated[
    str,
    typer.Option(callback=_size, help="Disk budget of --cache-dir (0: keep nothing on disk)."),
]
DebugCacheOption = Annotated[
    bool,
    typer.Option(
        "--debug-cache",
        help="Show the prompt text around each prefix-cache miss in /v1/stats, mlx dash and "
        "the log: other clients' words, so for debugging only (default: where it happened, "
        "with digests of the text).",
    ),
]
SafeguardsOption = Annotated[
    bool,
    typer.Option(
        "--safeguards/--no-safeguards",
        help="Judge Claude Code's auto-mode safety check with the loaded model (models under "
        "1B parameters answer that the check is unavailable; so does --no-safeguards).",
    ),
]
