"""This project's server, started in this process the way `mlx serve` runs it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.models import ModelSet, ServedModel, companion_config
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

OURS_NAME = "mlxlaunch"


@dataclass
class LocalServer:
    """An engine with its model loaded, served over HTTP on loopback."""

    engine: Engine | ModelSet
    handle: ServerHandle
    auth_token: str

    @property
    def url(self) -> str:
        return self.handle.url

    def describe(self) -> dict[str, Any]:
        """Engine settings worth recording next to the figures."""
        config = self.engine.config
        return {
            "kind": "in-process",
            "url": self.url,
            "max_concurrency": config.max_concurrency,
            "prefill_chunk": config.prefill_chunk,
            "context_length": config.context_length,
        }

    def stop(self) -> None:
        """Stop the HTTP server, then the engine's worker."""
        self.handle.stop()
        self.engine.close()


async def start_local_server(
    model_dir: str, *, small_model: str | None = None, **engine_options: Any
) -> LocalServer:
    """Load `model_dir` into a new engine and serve it on a free loopback port; with
    `small_model`, that model beside it for Claude Code's haiku tier, as
    `mlx serve --small-model` serves it."""
    config = EngineConfig(model=model_dir, **engine_options)
    engine: Engine | ModelSet = Engine(config)
    if small_model is not None:
        small = ServedModel(companion_config(config, small_model), role="small")
        engine = ModelSet([ServedModel(config), small])
    try:
        engine.start()
        await engine.load()
        token = secrets.token_hex(16)
        handle = start_server(engine, ServerSettings(auth_token=token))
    except BaseException:
        engine.close()
        raise
    return LocalServer(engine=engine, handle=handle, auth_token=token)
