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

Models on demand (`finder`): a request naming a model the set does not serve, but the store
has on disk, loads it beside the others (its requests then go there), within `memory_budget`
bytes of weights: the least recently used model that was loaded on demand and is idle is
closed to make room; a model the set was started with (pinned) never is. An id that names a
model one could pull but that is not on disk is a `ModelNotServed` (404) that says how to get
it; any other id goes to the main model.

The set has the engine's face (`submit`, `cancel`, `count_tokens`, `stats`, `model_info`,
`load`, `close`), so the server takes either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.conductor import Conductor
from mlxlaunch.engine.stats import EngineStats, StatsBook
from mlxlaunch.engine.types import (
    Admitted,
    EngineEvent,
    EngineUnavailable,
    GenerationRequest,
    ModelInfo,
    ModelNotServed,
    PromptTooLong,
)
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.store.facts import weights_size
from mlxlaunch.store.memory import format_bytes

log = logging.getLogger(__name__)

# main: the model unknown ids go to; small: Claude Code's haiku tier (background work);
# extra: served under its own names only.
ModelRole = Literal["main", "small", "extra"]

# What a model id names in the store: a local directory, MISSING (a model one could pull, not
# on disk), or None (no model's name: the main model serves it).
MISSING: Literal["missing"] = "missing"
Finder = Callable[[str], "Path | Literal['missing'] | None"]


def companion_config(main: EngineConfig, model: str) -> EngineConfig:
    """The engine settings of a model served beside `main`: the main model's, but its own
    window and no draft model (a draft model is the main one's)."""
    return replace(main, model=model, context_length=None, draft_model=None, speculate="auto")


# Ids remembered as naming no model (a bound: clients choose ids).
MAX_NO_MODEL_IDS = 1024

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
    pinned: bool = True  # False: loaded on demand, closed to make room for another
    weights_bytes: int = 0  # its weight files' size (the memory budget counts them)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        """How logs name it: its first id, else its directory's name."""
        return self.names[0] if self.names else Path(self.config.model).name

    def picks(self, model_id: str) -> bool:
        wanted = model_id.strip().lower()
        return any(name.lower() == wanted for name in self.names)


@dataclass
class ModelSet:
    """The served models, the first one the main model."""

    models: list[ServedModel]
    # The MLX thread the models share; one model keeps a thread of its own (no conductor).
    conductor: Conductor | None = field(default=None)
    finder: Finder | None = None  # None: no model is loaded on demand
    memory_budget: int | None = None  # bytes of weights all loaded models may hold (None: any)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("a model set needs at least one model")
        if self.models[0].role != "main" or self.models[0].failure is not None:
            raise ValueError("the first model of a set is its main model")
        if self.conductor is None and (len(self.models) > 1 or self.finder is not None):
            self.conductor = Conductor()
        self._joining = asyncio.Lock() if self.finder is not None else None
        for model in self.models:
            if self.conductor is not None:  # one thread: a directory's weights loaded once
                model.config = replace(model.config, share_weights=True)
            if model.engine is None and model.failure is None:  # a failed one never loads
                model.engine = Engine(model.config, conductor=self.conductor)
            if self.memory_budget is not None and not model.weights_bytes:  # the budget counts it
                model.weights_bytes = weights_size(Path(model.config.model))
        # Ids the store said name no model (Claude Code's tier ids, every turn): not asked again.
        self._no_model: set[str] = set()

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
        and its requests go to the main model); the main model's facts.

        The main model loads last: its engine measures the memory in use once its weights are
        in, and sizes the window it serves (what Claude Code is told) by what is left, so the
        other models' weights must be in by then."""
        others = [m for m in self.models[1:] if m.engine is not None]
        results = await asyncio.gather(
            *(m.engine.load() for m in others if m.engine is not None), return_exceptions=True
        )
        for model, result in zip(others, results, strict=True):
            if isinstance(result, BaseException):
                self._failed(model, result)
        return await self.main.load()

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
        return [
            (
                None if m is self.models[0] or not m.names else m.names[0],
                m.engine.model_info if m.engine is not None else None,
            )
            for m in self._loaded()
        ]

    # --- requests -----------------------------------------------------------------------

    def route(self, model_id: str) -> ServedModel:
        """The model that serves requests for `model_id` (see the module docstring)."""
        usable = self._loaded()
        for model in usable:
            if model.picks(model_id):
                model.last_used = time.monotonic()
                return model
        if HAIKU_TIER in model_id.lower():
            for model in usable:
                if model.role == "small":
                    return model
        return self.models[0]

    async def loaded_model_info(self, model_id: str) -> ModelInfo:
        """The facts of the model that serves `model_id`, loading it (on demand too) first."""
        engine = (await self._serving(model_id)).engine
        assert engine is not None
        return engine.model_info or await engine.load()

    def _engine_for(self, model_id: str) -> Engine:
        engine = self.route(model_id).engine
        assert engine is not None
        return engine

    async def submit(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        """The routed model's `Engine.submit`; a prompt the small model's window cannot hold
        goes to the main model instead."""
        routed = served = await self._serving(request.model_alias)
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
            served = self.models[0]
            stream = self.main.submit(request)
            first = await anext(stream)
        except StopAsyncIteration:
            return
        if isinstance(first, Admitted) and len(self.models) > 1:
            first = replace(first, served_by=served.name)
        try:
            yield first
            async for event in stream:
                yield event
        finally:
            await stream.aclose()

    # --- models on demand ------------------------------------------------------------------

    async def _serving(self, model_id: str) -> ServedModel:
        """`route`, after loading the model `model_id` names where the store has it."""
        routed = self.route(model_id)
        if self.finder is None or routed.picks(model_id) or routed.role != "main":
            return routed
        if model_id in self._no_model:
            return routed
        found = await asyncio.to_thread(self.finder, model_id)
        if found is None:
            if len(self._no_model) < MAX_NO_MODEL_IDS:
                self._no_model.add(model_id)
            return routed
        if found == MISSING:
            raise ModelNotServed(
                f"model {model_id!r} is not served here and not downloaded: pull it with "
                f"`mlx models pull {model_id}`, or ask for a served model (GET /v1/models)"
            )
        assert self._joining is not None
        async with self._joining:  # one load per model, however many ask at once
            again = self.route(model_id)
            if again.picks(model_id):
                return again
            return await self._join(model_id, Path(found))

    async def _join(self, model_id: str, path: Path) -> ServedModel:
        weights = weights_size(path)
        await self._make_room(weights, model_id)
        config = companion_config(self.models[0].config, str(path))
        model = ServedModel(
            config, (model_id, path.name), role="extra", pinned=False, weights_bytes=weights
        )
        model.engine = Engine(config, conductor=self.conductor)
        model.engine.start()
        self.models.append(model)
        log.info("serving %s on demand (%s of weights)", model_id, format_bytes(weights))
        return model

    async def _make_room(self, weights: int, model_id: str) -> None:
        """Close idle models loaded on demand, least recently used first, until `weights`
        more bytes fit the budget."""
        budget = self.memory_budget
        if budget is None:
            return
        while sum(m.weights_bytes for m in self._loaded()) + weights > budget:
            idle = [
                m
                for m in self._loaded()
                if not m.pinned and m.engine is not None and _idle(m.engine.stats())
            ]
            if not idle:
                raise EngineUnavailable(
                    f"model {model_id!r} ({format_bytes(weights)}) does not fit beside the "
                    f"models in use within this server's {format_bytes(budget)} for weights"
                )
            oldest = min(idle, key=lambda m: m.last_used)
            log.info("closing %s to make room for %s", oldest.names[0], model_id)
            self.models.remove(oldest)
            engine, oldest.engine = oldest.engine, None
            assert engine is not None
            await asyncio.to_thread(engine.close)

    def _loaded(self) -> list[ServedModel]:
        return [m for m in self.models if m.engine is not None and m.failure is None]

    def cancel(self, request_id: str) -> None:
        for engine in self.engines():  # ids are unique across the set: only one holds it
            engine.cancel(request_id)

    async def count_tokens(self, request: GenerationRequest) -> int:
        engine = (await self._serving(request.model_alias)).engine
        assert engine is not None
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


def _idle(stats: EngineStats) -> bool:
    return stats.running == 0 and stats.queue_depth == 0
