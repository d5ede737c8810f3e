"""Options shared by several commands, so a flag means the same thing (and completes the same
way) everywhere: `--json`, and `--model` with the model names known without a download.

`MODEL_METAVAR` marks a parameter whose value is a model name: the help shows `MODEL`, and the
shell completion scripts (cli/completions.py) complete model names there: `known_model_names()`
written into the script, and the local ones from `mlx models list --names`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

MODEL_METAVAR = "MODEL"

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]


def known_model_names() -> list[str]:
    """Names that need nothing on this machine: the offline test models and catalog aliases."""
    from mlxlaunch.launch.models import offline_model_names
    from mlxlaunch.store import CATALOG

    return [*offline_model_names(), *(entry.alias for entry in CATALOG)]


def model_option(help: str) -> Any:
    """A `--model/-m` option whose value is a model name (help: what it accepts)."""
    return typer.Option("--model", "-m", metavar=MODEL_METAVAR, help=help)
