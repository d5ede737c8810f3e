"""The shared served fixture (a pytest plugin, conftest.py): one live server per test module.

`served` is a real server (the app under uvicorn on a real socket, as `mlx serve` runs it) over
the tiny model, its output scripted (`served.scripted.enqueue`), no token, the Anthropic SDK as
`served.client`; conversation stores in a directory of its own. Module scope: under `--dist
loadgroup` a module's tests share one worker (conftest.py), so each module starts one server,
and no test sees another module's counters or caches. A module that needs another kind (a
token, the OpenAI SDK as `client`, a smaller window) builds it with `engine_helpers.serve`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from engine_helpers import Served


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A live server on the tiny model for this module's tests (see the module's docstring)."""
    from engine_helpers import serve  # imports mlx: only for the modules that serve

    stores = tmp_path_factory.mktemp("served")
    settings = {"threads_dir": stores / "threads"}
    with serve(tiny_model_dir, settings=settings) as server:
        yield server
