"""Typed errors shared by every room; turned into text only at the edges (CLI, HTTP)."""

from __future__ import annotations


class MlxLaunchError(Exception):
    """Base of every error this product raises on purpose.

    `exit_code` is what the CLI exits with when this error reaches it.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(MlxLaunchError):
    """The user's options or configuration cannot work as given."""

    exit_code = 2


class ModelNotFound(MlxLaunchError):
    """A model name resolves to nothing local (and, for pulls, nothing on the hub)."""

    exit_code = 3


class DefaultModelMissing(ModelNotFound):
    """The default-model setting names a model that is not here (`cause` says why)."""

    def __init__(self, cause: ModelNotFound, name: str, where: str = "") -> None:
        super().__init__(f"{cause.message}: '{name}' is the default-model setting{where}")
        self.cause, self.name, self.where = cause, name, where


class ModelLoadError(MlxLaunchError):
    """A model directory exists but cannot be loaded."""

    exit_code = 4


class NetworkError(MlxLaunchError):
    """The hub (or another remote) cannot be reached."""

    exit_code = 5


class AgentNotFound(MlxLaunchError):
    """An agent's CLI (`claude`, `codex`, …) is not installed or not on PATH."""

    exit_code = 6


ClaudeNotFound = AgentNotFound  # its name from before every agent was a row of one table
