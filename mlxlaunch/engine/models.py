"""Several models in one server: each its own `Engine`, one MLX thread, routing by model id.

    models = ModelSet.start([
        ServedModel(EngineConfig(model=main_path), names=("qwen3-30b",)),
        ServedModel(EngineConfig(model=small_path), names=("qwen3-0.6b",), role="small"),
    ])
    async for event in models.submit(request):   # request.model_alias picks the engine
        ...

Every model keeps what it has alone — its batch, prefix cache, admission queue, stats and idle
unload (keep-alive) — while one `Conductor` (scheduling/conductor.py) runs all their worker
loops on the one MLX thread, the main model first.

Which model serves a request (`route`): the model whose name the request's id is (any case),
else, for a Claude Code haiku-tier id (one containing `haiku`), the small model, else the main
model — Claude Code sends ids nobody can predict, so an unknown id is never an error. A model
that failed to load is routed around (its requests go to the main model), and the failure
stays in its stats for `mlx ps`, the log and the dashboard. A prompt too long for the small
model's window is served by the main model.

The set has the engine's face (`submit`, `cancel`, `count_tokens`, `stats`, `model_info`,
`load`, `close`), so the server takes either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.conductor import Conductor
from mlxlaunch.engine.stats import EngineStats, StatsBook
from mlxlaunch.engine.types import (
    EngineEvent,
    EngineUnavailable,
    GenerationRequest,
    ModelInfo,
    PromptTooLong,
)
from mlxlaunch.errors import MlxLaunchError

log = logging.getLogger(__name__)

# main: the model unknown ids go to; small: Claude Code's haiku tier (background work);
# extra: served under its own names only.
ModelRole = Literal["main", "small", "extra"]

# A request id with this in it is Claude Code's background tier (ANTHROPIC_DEFAULT_HAIKU_MODEL's
# default ids, `claude-haiku-4-5-…`, `claude-3-5-haiku-…`).
HAIKU_TIER = "haiku"


@dataclass
class ServedModel:
    """One model of the set: how to load it and the ids that pick it."""

    config: EngineConfig
    names: Sequence[str] = ()  # ids a client may send for it (matched in any case)
    role: ModelRole = "main"
    engine: Engine | None = None  # set by ModelSet
    failure: str | None = None  # why it could not be loaded (then it is routed around)

    def picks(self, model_id: str) -> bool:
        wanted = model_id.strip().lower()
        return any(name.lower() == wanted for name in self.names)


@dataclass
class ModelSet:
    """The served models, the first one the main model."""

    models: list[ServedModel]
    # The MLX thread the models share; one model keeps a thread of its own (no conductor).
    conductor: Conductor | None = field(default=None)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("a model set needs at least one model")
        if self.models[0].role != "main" or self.models[0].failure is not None:
            raise ValueError("the first model of a set is its main model")
        if self.conductor is None and len(self.models) > 1:
            self.conductor = Conductor()
        for model in self.models:
            if self.conductor is not None:  # one thread: a directory's weights loaded once
                model.config = replace(model.config, share_weights=True)
            if model.engine is None and model.failure is None:  # a failed one never loads
                model.engine = Engine(model.config, conductor=self.conductor)

    # --- lifetime -----------------------------------------------------------------------

    @property
    def main(self) -> Engine:
        engine = self.models[0].engine
        assert engine is not None
        return engine

    @property
    def config(self) -> EngineConfig:
        """The main model's configuration."""
        return self.main.config

    def engines(self) -> list[Engine]:
        return [m.engine for m in self.models if m.engine is not None]

    def start(self) -> None:
        for engine in self.engines():
            engine.start()

    def close(self) -> None:
        for engine in reversed(self.engines()):
            engine.close()

    async def load(self) -> ModelInfo:
        """Load every model (the main one's failure raises; another's is noted and logged,
        and its requests go to the main model); the main model's facts."""
        loading = [m for m in self.models if m.engine is not None]
        results = await asyncio.gather(
            *(m.engine.load() for m in loading if m.engine is not None), return_exceptions=True
        )
        for model, result in zip(loading, results, strict=True):
            if isinstance(result, BaseException) and model is not self.models[0]:
                self._failed(model, result)
        main = results[0]
        if isinstance(main, BaseException):
            raise main
        return main

    def _failed(self, model: ServedModel, error: BaseException) -> None:
        detail = error.message if isinstance(error, MlxLaunchError) else str(error)
        model.failure = f"{model.config.model} could not be loaded: {detail}"
        log.error("the %s model %s", model.role, model.failure)

    @property
    def lost(self) -> EngineUnavailable | None:
        return self.main.lost

    @property
    def model_info(self) -> ModelInfo | None:
        """The main model's facts (None before its first load)."""
        return self.main.model_info

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        """The facts of the model that serves requests for `model_id`."""
        return self._engine_for(model_id).model_info

    def served_models(self) -> list[tuple[str | None, ModelInfo | None]]:
        """Every model that serves (`GET /v1/models`): the id it is listed under (None for
        the main model: the server's own id) and its facts once loaded."""
        listed: list[tuple[str | None, ModelInfo | None]] = []
        for i, model in enumerate(self.models):
            if model.engine is None or model.failure is not None:
                continue
            name = None if i == 0 or not model.names else model.names[0]
            listed.append((name, model.engine.model_info))
        return listed

    # --- requests -----------------------------------------------------------------------

    def route(self, model_id: str) -> ServedModel:
        """The model that serves requests for `model_id` (see the module docstring)."""
        usable = [m for m in self.models if m.failure is None]
        for model in usable:
            if model.picks(model_id):
                return model
        if HAIKU_TIER in model_id.lower():
            for model in usable:
                if model.role == "small":
                    return model
        return self.models[0]

    def _engine_for(self, model_id: str) -> Engine:
        engine = self.route(model_id).engine
        assert engine is not None
        return engine

    async def submit(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        """The routed model's `Engine.submit`; a prompt the small model's window cannot hold
        goes to the main model instead."""
        routed = self.route(request.model_alias)
        engine = routed.engine
        assert engine is not None
        stream = engine.submit(request)
        try:
            first = await anext(stream)
        except (PromptTooLong, EngineUnavailable) as exc:
            if engine is self.main:
                raise
            if isinstance(exc, EngineUnavailable):
                if engine.model_info is not None:  # loaded, but shutting down: so is main
                    raise
                self._failed(routed, exc)  # it could not load: main serves its ids from now
            why = "too long for" if isinstance(exc, PromptTooLong) else "not served by"
            log.info(
                "%s: %s the %s model; the main one serves it", request.request_id, why, routed.role
            )
            await stream.aclose()
            stream = self.main.submit(request)
            first = await anext(stream)
        except StopAsyncIteration:
            return
        try:
            yield first
            async for event in stream:
                yield event
        finally:
            await stream.aclose()

    def cancel(self, request_id: str) -> None:
        for engine in self.engines():  # ids are unique across the set: only one holds it
            engine.cancel(request_id)

    async def count_tokens(self, request: GenerationRequest) -> int:
        engine = self._engine_for(request.model_alias)
        try:
            return await engine.count_tokens(request)
        except PromptTooLong:
            if engine is self.main:
                raise
            return await self.main.count_tokens(request)

    def stats(self) -> EngineStats:
        """The main model's stats; several models: every model's own (the main one first,
        one that failed to load with its failure) in `models`."""
        if len(self.models) == 1:
            return self.main.stats()
        per_model = []
        for model in self.models:
            own = (
                model.engine.stats()
                if model.engine is not None
                else StatsBook(time.monotonic).snapshot()
            )
            per_model.append(
                replace(
                    own,
                    role=model.role,
                    listed_as=model.names[0] if model.names else None,
                    failure=model.failure,
                )
            )
        return replace(per_model[0], models=tuple(per_model))
