"""Store errors carry data and no command's words; the CLI's one table says them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mlxlaunch.cli.error_text import TABLE, error_text
from mlxlaunch.errors import DefaultModelMissing, MlxLaunchError
from mlxlaunch.store.errors import (
    BadShardSpec,
    ModelInUse,
    ModelNotDownloaded,
    NotAnMlxModel,
    UnknownModel,
)

STORE = Path(__file__).resolve().parent.parent / "mlxlaunch" / "store"


@pytest.mark.parametrize(
    ("error", "message", "hint"),
    [
        (
            ModelNotDownloaded("m"),
            "model 'm' is not downloaded",
            "download it first: mlx models pull m",
        ),
        (
            ModelNotDownloaded("m", partly=True),
            "model 'm' is only partly downloaded",
            "finish the download: mlx models pull m",
        ),
        (
            ModelInUse("m", "http://x", 7),
            "'m' is loaded by a running server (http://x, pid 7)",
            "stop that server (or `mlx launch` session) first",
        ),
        (
            NotAnMlxModel("o/r", ["no tokenizer"]),
            "'o/r' is not a model MLX can load: no tokenizer",
            "pass --force to download it anyway",
        ),
        (BadShardSpec("3/2", 2), "--shard '3/2': ranks run from 0 to 1", None),
        (
            DefaultModelMissing(UnknownModel("x"), "x", " in /c"),
            "unknown model 'x': 'x' is the default-model setting in /c",
            None,
        ),
    ],
)
def test_each_error_is_said_by_its_row(
    error: MlxLaunchError, message: str, hint: str | None
) -> None:
    said, advice = error_text(error)
    assert said == message
    if hint is not None:
        assert advice == hint
    assert not error.hint  # the error itself names no command


def test_a_wrapped_cause_keeps_its_hint() -> None:
    _, hint = error_text(DefaultModelMissing(ModelNotDownloaded("m"), "m"))
    assert hint is not None and hint.startswith("download it first: mlx models pull m; or ")


def test_every_row_is_a_typed_error() -> None:
    assert all(issubclass(kind, MlxLaunchError) for kind in TABLE)


def test_no_store_error_names_a_command() -> None:
    """No string the store raises with names `mlx …` or a `--flag`."""
    found = []
    for path in sorted(STORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = ast.unparse(node.exc)
                if "mlx models" in text or "mlx launch" in text or "'--" in text or '"--' in text:
                    found.append(f"{path.name}:{node.lineno}: {text[:80]}")
    assert not found, "\n".join(found)
