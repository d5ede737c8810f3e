"""What the HTTP app is built from: its settings, and the part of the engine it serves.

A leaf of the server room: `app.py` builds the app from these, and each API's handlers
(messages.py, chat_completions.py, responses.py) read them, so nothing here imports a handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mlxlaunch.engine.types import EngineEvent, GenerationRequest, ModelInfo
from mlxlaunch.server.conversation_files import ThreadLimits
from mlxlaunch.server.guards import HttpLimits
from mlxlaunch.server.images import ImageAccess, ImageLimits
from mlxlaunch.server.safeguards import SAFEGUARDS_MIN_PARAMETERS
from mlxlaunch.server.sealed_reasoning import ReasoningSeal
from mlxlaunch.server.search_backends import SearchBackend


class ServingEngine(Protocol):
    """The part of `mlxlaunch.engine.Engine` the HTTP layer uses."""

    def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]: ...

    def cancel(self, request_id: str) -> None: ...

    async def count_tokens(self, req: GenerationRequest) -> int: ...

    @property
    def model_info(self) -> ModelInfo | None: ...

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        """The facts of the model that serves requests naming `model_id` (several models:
        engine/models.py routes by id)."""
        ...

    def served_models(self) -> list[tuple[str | None, ModelInfo | None]]:
        """Every model served: the id it is listed under (None: the server's own id for the
        main model) and its facts (None before its load); the main model first."""
        ...

    async def loaded_model_info(self, model_id: str) -> ModelInfo:
        """The facts of the model that serves `model_id`, loading it first if need be."""
        ...


async def served_model_info(engine: ServingEngine, model_id: str) -> ModelInfo | None:
    """The facts of the model that serves `model_id`, its load awaited if it has not loaded
    yet (whether it sees images decides how a request's images map); None if it cannot load
    (the request's submit then reports why)."""
    info = engine.model_info_for(model_id)
    if info is not None:
        return info
    try:
        return await engine.loaded_model_info(model_id)
    except Exception:  # reported by the submit that follows, in the API's own words
        return None


@dataclass(frozen=True)
class ServerSettings:
    """How the HTTP layer behaves.

    Args:
        host: interface to bind (loopback by default: the server runs code on your machine).
        port: TCP port; 0 picks a free one (the runner reports the real one).
        auth_token: required as `Authorization: Bearer` or `x-api-key`; None disables auth.
        heartbeat_s: longest silence on a stream before a `ping` (Claude Code waits 300 s).
        admission_grace_s: how long to wait for admission before starting the stream anyway;
            errors that arrive within it still get their own HTTP status (400, 429).
    """

    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str | None = None
    heartbeat_s: float = 5.0
    admission_grace_s: float = 2.0
    # Security (server/guards.py, SECURITY.md): beyond loopback only when allowed, with a token.
    allow_remote: bool = False
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call (none by default)
    limits: HttpLimits = field(default_factory=HttpLimits)
    # The id /v1/models lists (what the user called the model); None: one made from its path.
    model_id: str | None = None
    # Cache-miss prompt excerpts in /v1/stats: other clients' prompt text, so off by default;
    # `--debug-cache` turns it on (launch/serving.py), with the engine's EngineConfig.debug_cache.
    stats_prompt_excerpts: bool = False
    # Message threads (server/threads.py): their budget, and where they are kept across
    # restarts (None: memory only; `serving_settings` puts them beside the disk KV cache).
    thread_limits: ThreadLimits = field(default_factory=ThreadLimits)
    threads_dir: Path | None = None
    # Claude Code's auto-mode safety check, judged by the loaded model (server/safeguards.py);
    # False (`--no-safeguards`), or a model under the minimum size, answers "unavailable".
    safeguards: bool = True
    safeguards_min_parameters: int = SAFEGUARDS_MIN_PARAMETERS
    # Images (server/images.py): their limits, and the vision model a text-only model's
    # refusal names (launch/ fills it from the store's catalog; None names none).
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    vision_model: str | None = None
    # Where the web search server tool's queries go (server/web_search.py); None: its calls
    # are answered "not configured" (`mlx config set search.backend …`).
    search: SearchBackend | None = None
    # Seals the reasoning Codex carries between turns (`reasoning.encrypted_content`); the
    # launcher keeps its key in mlxlaunch's home so sessions outlive a restart.
    reasoning_seal: ReasoningSeal = field(default_factory=ReasoningSeal)

    def image_access(self, info: ModelInfo | None) -> ImageAccess:
        """What images the loaded model (`info`; None before the first load) may be sent."""
        return ImageAccess(
            sees_images=info is not None and info.vision,
            limits=self.image_limits,
            vision_model=self.vision_model,
        )
