"""TEST-ONLY: scripted model output for a launcher whose server runs in-process.

End-to-end tests start `mlx launch claude` as a separate process, so they cannot hand the engine
a `ScriptedOutput` object. Instead they set `MLXLAUNCH_TEST_SCRIPT` to a JSON file:

    {"outputs": ["plain text reply", {"text": "..."}, {"tokens": [12, 34]}]}

(a bare list works too). Each request the engine serves takes the next output; once they are
used up the model samples normally. Users never set this variable; nothing else reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxlaunch.errors import ConfigError
from mlxlaunch.testing import ScriptedOutput

TEST_SCRIPT_ENV = "MLXLAUNCH_TEST_SCRIPT"


def scripted_output_from_env(env: Mapping[str, str]) -> ScriptedOutput | None:
    """A ScriptedOutput loaded from `$MLXLAUNCH_TEST_SCRIPT`, or None when it is unset."""
    path = env.get(TEST_SCRIPT_ENV)
    if not path:
        return None
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{TEST_SCRIPT_ENV}={path}: {exc}") from exc
    outputs = data.get("outputs", []) if isinstance(data, dict) else data
    scripted = ScriptedOutput()
    for item in outputs:
        if isinstance(item, str):
            scripted.enqueue(text=item)
        elif isinstance(item, dict) and "tokens" in item:
            scripted.enqueue(tokens=[int(t) for t in item["tokens"]])
        elif isinstance(item, dict) and "text" in item:
            scripted.enqueue(text=str(item["text"]))
        else:
            raise ConfigError(f"{TEST_SCRIPT_ENV}: cannot read output {item!r}")
    return scripted
