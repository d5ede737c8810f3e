"""This project's server, started in this process the way `mlx serve` runs it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

OURS_NAME = "mlxlaunch"


@dataclass
class LocalServer:
    """An engine with its model loaded, served over HTTP on loopback."""

    engine: Engine
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


async def start_local_server(model_dir: str, **engine_options: Any) -> LocalServer:
    """Load `model_dir` into a new engine and serve it on a free loopback port."""
    engine = Engine(EngineConfig(model=model_dir, **engine_options))
    try:
        engine.start()
        await engine.load()
        token = secrets.token_hex(16)
        handle = start_server(engine, ServerSettings(auth_token=token))
    except BaseException:
        engine.close()
        raise
    return LocalServer(engine=engine, handle=handle, auth_token=token)
