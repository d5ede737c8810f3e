"""What the server is serving: `/v1/models` (both APIs' shapes), `/health`, `/api/hello`.

Any id is served (by the model whose name it is, else the main model: engine/models.py), so
any id "exists" under `/v1/models/{id}`; the listing names every model served. The ids
listed are plain ones (what the user called the model, or one made from its path): an id a
client may send back, and the unauthenticated `/health` does not reveal where the model lives.
"""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxlaunch.engine.types import ModelInfo
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.protocol.responses import ModelEntry, ModelList
from mlxlaunch.server.auth import Guard
from mlxlaunch.server.chat_mapping import openai_list_body, openai_model_body, speaks_openai
from mlxlaunch.server.settings import ServingEngine


def model_routes(
    engine: ServingEngine, model_id: str | None, guard: Guard, open_guard: Guard
) -> list[Route]:
    """The model listing (behind `guard`), and the liveness routes (behind `open_guard`,
    which checks no token)."""
    api = ModelsApi(engine, model_id)
    return [
        Route("/v1/models", guard(api.models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guard(api.model), methods=["GET"]),
        Route("/api/hello", open_guard(api.hello), methods=["GET", "HEAD"]),
        Route("/health", open_guard(api.health), methods=["GET"]),
    ]


class ModelsApi:
    """The model routes bound to one engine and the id the user gave it (None: its path's)."""

    def __init__(self, engine: ServingEngine, model_id: str | None) -> None:
        self.engine = engine
        self.model_id = model_id
        self.created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    async def models(self, request: Request) -> Response:
        entries = [
            self._entry(name or self._loaded_id(), info)
            for name, info in self.engine.served_models()
        ]
        # Each API's clients expect their own shape; the rule is `speaks_openai`'s docstring.
        if speaks_openai(request.headers):
            return JSONResponse(openai_list_body(entries))
        listing = ModelList(data=entries, first_id=entries[0].id, last_id=entries[-1].id)
        return JSONResponse(listing.model_dump())

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        entry = self._entry(model_id, self.engine.model_info_for(model_id))
        if speaks_openai(request.headers):
            return JSONResponse(openai_model_body(entry))
        return JSONResponse(entry.model_dump())

    async def hello(self, request: Request) -> Response:
        return Response(status_code=200)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self._loaded_id()})

    def _loaded_id(self) -> str:
        info = self.engine.model_info
        if info is None:
            return "unloaded"
        return self.model_id or plain_model_id(info.id)

    def _entry(self, model_id: str, info: ModelInfo | None) -> ModelEntry:
        # The window lets a client such as `mlx launch claude --print-env --url` size itself.
        window = info.context_window if info is not None else None
        return ModelEntry(
            id=model_id,
            display_name=model_id,
            created_at=self.created_at,
            max_input_tokens=window,
            max_tokens=window,
        )
